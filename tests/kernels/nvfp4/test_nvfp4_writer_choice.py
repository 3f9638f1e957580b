"""The nvfp4 writer's revision and tie mode are the user's choice (fuzz --nvfp4-writer, --ties):
carried by each case's spec (so bundles, replays and shrinks judge alike), recorded in run.json and
checked by --resume; a tie-only difference is an info counted apart under --ties either; a mismatch
another writer revision writes exactly says which."""

from __future__ import annotations

import dataclasses
import json

from mlafuzz.generators.draw import SMALL
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.cli.main import main
from mlafuzz.reports.findings import Severity
from mlafuzz.tests.support.cuda_cases import cpu_triton
from mlafuzz.tests.support.helpers import draw_spec, materialize, resolve, run_case, spec_from_dict


def _findings(impl: str, n: int, **knobs: str) -> list:
    entry = resolve("nvfp4_writer", impl)
    out = []
    for seed in range(n):
        spec = draw_spec("nvfp4_writer", seed=seed, knobs=dataclasses.replace(SMALL, **knobs))
        out += run_case(case=materialize(spec, seed), entry=entry).findings
    return out


def test_a_writer_of_another_revision_is_clean_when_the_run_names_that_revision():
    assert _findings("nvfp4_writer_div", 16, nvfp4_writer="rn_bump.div") == []
    assert _findings("nvfp4_writer_no_bump", 16, nvfp4_writer="rn.mul_recip") == []


def test_a_mismatch_another_writer_revision_writes_exactly_names_it():
    found = _findings("nvfp4_writer_no_bump", 8)
    assert found and all(
        "matches nvfp4 writer rn.mul_recip exactly: --nvfp4-writer rn.mul_recip" in f.message for f in found
    )
    assert all(f.extra["matches_nvfp4_writer"] == "rn.mul_recip" for f in found)


def test_under_ties_either_a_tie_only_difference_is_an_info_and_any_other_stays_a_failure():
    tied = _findings("nvfp4_writer_div", 16, nvfp4_ties="either")
    assert tied and all(f.severity is Severity.INFO and f.extra["tie_hits"] > 0 for f in tied)
    assert all(f.message.startswith("bit-exact except") for f in tied)
    bumped = _findings("nvfp4_writer_no_bump", 8, nvfp4_ties="either")
    assert bumped and all(f.severity is Severity.ERROR for f in bumped)


def test_the_spec_carries_the_writer_revision_and_tie_mode_through_a_bundle():
    knobs = dataclasses.replace(SMALL, nvfp4_writer="rn.div", nvfp4_ties="either")
    spec = draw_spec("nvfp4_writer", seed=3, knobs=knobs)
    again = spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))))
    case = materialize(again, 3)
    assert (case.params["nvfp4_revision"], case.params["nvfp4_ties"]) == ("rn.div", "either")
    old = spec_to_dict(spec)  # a bundle written before the fields existed: vLLM's revision, exact
    del old["spec"]["writer_revision"], old["spec"]["ties"]
    assert materialize(spec_from_dict(old), 3).params["nvfp4_revision"] == "rn_bump.mul_recip"


@cpu_triton
def test_fuzz_records_the_choice_reports_ties_apart_and_resume_refuses_another(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["fuzz", "--op", "nvfp4_writer", "--impl", "nvfp4_writer=nvfp4_writer_div", "--device", "cpu"]
    argv += ["--cases", "12", "--seed", "1", "--workers", "1", "--in-process", "--out", str(out)]
    assert main([*argv, "--ties", "either"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == 0 and summary["tie_hits"] > 0
    assert f"bit-exact except {summary['tie_hits']} ties" in capsys.readouterr().out  # the summary line
    assert json.loads((out / "run.json").read_text())["knobs"]["nvfp4_ties"] == "either"
    assert main([*argv, "--ties", "either", "--nvfp4-writer", "rn.div", "--resume"]) == 2
    assert "its knobs is" in capsys.readouterr().err


@cpu_triton
def test_a_bundle_replays_under_the_writer_revision_its_run_named(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["fuzz", "--op", "nvfp4_writer", "--impl", "nvfp4_writer=nvfp4_writer_bump_added", "--device", "cpu"]
    argv += ["--cases", "4", "--seed", "1", "--workers", "1", "--in-process", "--out", str(out)]
    assert main([*argv, "--nvfp4-writer", "rn.mul_recip", "--shrink-budget", "5"]) == 1
    (bundle,) = (out / "bundles").iterdir()
    capsys.readouterr()
    assert main(["replay", str(bundle)]) == 1  # judged under rn.mul_recip again, where it bumps
    assert "reproduces" in capsys.readouterr().out


@cpu_triton
def test_merged_shards_sum_their_tie_hits(tmp_path):
    argv = ["fuzz", "--op", "nvfp4_writer", "--impl", "nvfp4_writer=nvfp4_writer_div", "--device", "cpu"]
    argv += ["--cases", "8", "--seed", "1", "--workers", "1", "--in-process", "--ties", "either"]
    shards = [tmp_path / f"s{k}" for k in range(2)]
    for k, out in enumerate(shards):
        assert main([*argv, "--shard", f"{k}/2", "--out", str(out)]) == 0
    ties = [json.loads((out / "summary.json").read_text())["tie_hits"] for out in shards]
    assert main(["merge", "--out", str(tmp_path / "merged"), *map(str, shards)]) == 0
    assert json.loads((tmp_path / "merged" / "summary.json").read_text())["tie_hits"] == sum(ties) > 0

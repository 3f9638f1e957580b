"""``--revision auto``: a run of vLLM's implementation is judged under the revision of the vLLM
release installed, as SPEC 10 maps each release to its rules.

The installed vLLM here is a fake one of our own: a ``vllm`` package on ``sys.path`` whose
``__version__`` is the release under test and whose planner is our own (the plan op is pure
Python, so a whole run takes a second on the CPU). ``MLAFUZZ_VLLM_VERSION`` wins over it.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.campaign import CampaignError, settle_revision
from mlafuzz.oracles import revisions

# SPEC 10's releases and the rules read from their wheels: writer scale, context chunks, counted convert.
EXPECTED = {
    "0.27.0": ("flt_min", "equal_width", "in_place"),
    "0.28.0": ("flt_min", "packing_planner", "in_place"),
    "0.29.0": ("flt_min", "packing_planner", "in_place"),
    "0.30.0": ("flt_min", "packing_planner", "compact"),
    "0.31.0": ("pow2_1e-4", "packing_planner", "compact"),
    "0.32.0": ("pow2_1e-4", "packing_planner", "compact"),
    "0.33.0": ("pow2_1e-4", "packing_planner", "compact"),
    "0.34.0": ("pow2_1e-4", "packing_planner", "compact"),
}
RULES = ("writer_scale", "context_chunks", "convert_counted")


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """Install a fake vllm of a given version (its planner is ours) and return the installer."""

    def install(version: str) -> None:
        pkg = tmp_path / version / "vllm"
        mod = pkg / "model_executor" / "layers" / "attention"
        mod.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
        for d in (pkg / "model_executor", pkg / "model_executor" / "layers", mod):
            (d / "__init__.py").touch()
        (mod / "mla_attention.py").write_text(
            textwrap.dedent("""
                from mlafuzz.kernels.planner import plan_context_chunks as plan_mla_context_chunks
            """)
        )
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(tmp_path / version))

    monkeypatch.delenv("MLAFUZZ_VLLM_VERSION", raising=False)
    return install


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_auto_picks_the_revision_whose_rules_are_the_installed_release(fake_vllm, version):
    fake_vllm(version)
    revision, release = settle_revision("auto", {"plan": "vllm"})
    assert release == version
    assert tuple(revisions.get(revision).rule(r) for r in RULES) == EXPECTED[version]


def test_auto_is_the_default_only_when_an_implementation_is_vllm(fake_vllm, monkeypatch):
    fake_vllm("0.27.0")
    assert settle_revision(None, {"plan": "vllm"}) == ("2026-07", "0.27.0")
    assert settle_revision(None, {"plan": "ours"}) == (None, None)  # the newest, as before
    assert settle_revision("2026-09", {"plan": "vllm"}) == ("2026-09", None)  # a named revision wins
    monkeypatch.setenv("MLAFUZZ_VLLM_VERSION", "0.34.0")  # the variable wins over the installed one
    assert settle_revision(None, {"plan": "vllm"}) == ("2026-11", "0.34.0")


def test_an_unknown_release_is_one_line_naming_the_known_ones(fake_vllm, tmp_path, capsys):
    fake_vllm("0.26.0")
    with pytest.raises(CampaignError, match=r"vLLM 0\.26\.0 is not a release .*0\.27\.0, .*0\.34\.0"):
        settle_revision("auto", {"plan": "vllm"})
    args = ["fuzz", "--impl", "plan=vllm", "--cases", "2", "--in-process", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0.26.0 is not a release" in err[0] and "Traceback" not in err[0]


def test_a_vllm_run_says_the_release_and_its_revision_and_records_them(fake_vllm, tmp_path, capsys):
    fake_vllm("0.28.0")
    out = tmp_path / "o"
    assert main(["fuzz", "--impl", "plan=vllm", "--cases", "20", "--in-process", "--out", str(out)]) == 0
    assert "vLLM 0.28.0: revision vllm-0.28" in capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    assert run["revision"] == "vllm-0.28" and run["vllm_release"] == "0.28.0"


def test_each_release_has_one_revision_and_every_release_revision_names_its_releases():
    for version in EXPECTED:
        name = revisions.for_release(version)
        assert version in revisions.TABLE.releases_of(name)
    assert revisions.TABLE.releases_of("vllm-0.28") == ("0.28.0", "0.29.0")
    assert revisions.TABLE.releases_of("2026-09") == ()  # a revision no release shipped

"""The README's two CI recipes ("Run it in CI"), run as printed on the CPU: a planted gather with
two bugs, the README's ledger waiving one of them, a shard that never arrives and a shard that CI
cancels. What a CI user must be able to trust: the ledgered bucket passes in the merged JUnit as
it did in each shard, a missing shard makes the merge job fail and its report say incomplete, and
a stopped run reports as stopped, never as passed.

Each recipe's commands are read from the README and run through ``main`` in this process: GPU
flags become CPU ones (``--device cpu``, ``--cases`` for ``--budget``), the fuzz line gets the
planted implementation, ``mlafuzz warmup`` (nothing to build on a CPU) and ``buildkite-agent``
(the shard folders are already here) are skipped.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from mlafuzz.harness.cli.main import main

ROOT = Path(__file__).parents[3]
PLANTED = ROOT / "tests" / "support" / "planted" / "sigterm_gather.py"
IMPL = f"{PLANTED}:gather"
CASES = 6  # per shard: enough for both planted bugs to show in the run (asserted below)
SEED = 5


def _ci_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Run it in CI", 1)[1].split("\n## ", 1)[0]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _ci_section(), flags=re.S)


def _commands(block: str) -> list[str]:
    """The ``command:``/``run:`` values of a YAML block, folded as YAML folds a plain scalar."""
    out: list[str] = []
    lines = block.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*(?:- )?)(?:command|run): (.*)$", line)
        if not m:
            continue
        parts = [m.group(2)]
        for nxt in lines[i + 1 :]:  # a continuation is indented past its key
            if len(nxt) - len(nxt.lstrip()) <= len(m.group(1)) or re.match(r"^\s*(- )?\w+:", nxt):
                break
            parts.append(nxt.strip())
        out.append(" ".join(parts))
    return out


def _recipes() -> dict[str, list[str]]:
    buildkite, github = _blocks("yaml")
    return {"buildkite": [buildkite, *_commands(buildkite)], "github": [github, *_commands(github)]}


def _ledger(*, waive: tuple[str, ...]) -> str:
    """The README's ledger, naming the planted implementation, one entry per kind waived."""
    (toml,) = _blocks("toml")
    entry = re.search(r"\{kind = .*?\}", toml).group(0).replace('impl = "vllm"', f'impl = "{IMPL}"')
    return "expected = [" + ", ".join(entry.replace("VALUE_MISMATCH", kind) for kind in waive) + "]\n"


def _on_cpu(argv: list[str]) -> list[str] | None:
    """A README command line as this test runs it; None for the steps a CPU job skips."""
    if argv[0] == "buildkite-agent" or argv[:2] == ["mlafuzz", "warmup"]:
        return None
    assert argv[0] == "mlafuzz", argv
    args = []
    for a in argv[1:]:
        args += sorted(glob.glob(a)) if "*" in a else [a]
    if args[0] == "fuzz":
        args = [{"cuda": "cpu", "600": str(CASES), "--budget": "--cases"}.get(a, a) for a in args]
        args += ["--op", "gather", "--impl", f"gather={IMPL}", "--shrink-budget", "0", "--in-process", "--quiet"]
    return args


def _sh(command: str, **values: str) -> int:
    """Run a recipe's command line as its CI's shell would (``&&`` chains), through ``main``."""
    for name, value in values.items():
        command = command.replace("${{ " + name + " }}", value)
    command = os.path.expandvars(command.replace("$$", "$"))  # Buildkite's $$ is a literal $
    rc = 0
    for step in command.split(" && "):
        argv = _on_cpu(shlex.split(step))
        rc = 0 if argv is None else main(argv)
        if rc != 0:
            break
    return rc


def _junit(path: Path) -> ET.Element:
    return ET.parse(path).getroot().find("testsuite")


def _fresh_merge_job(*dirs: str) -> None:
    """What a merge job starts from: the shard folders it downloaded, nothing else."""
    shutil.rmtree("merged", ignore_errors=True)
    for name in ("fuzz.xml", "mlafuzz-ledger.toml"):
        Path(name).unlink(missing_ok=True)
    for d in dirs:
        shutil.rmtree(d)


def test_the_github_recipe_fails_only_on_unledgered_buckets_and_on_a_missing_shard(tmp_path, monkeypatch, capsys):
    block, fuzz_step, merge_step = _recipes()["github"]
    shards = [int(k) for k in re.search(r"shard: \[([\d, ]+)\]", block).group(1).split(",")]
    count = re.search(r'MLAFUZZ_SHARD: "\$\{\{ matrix.shard \}\}/(\d+)"', block).group(1)
    monkeypatch.chdir(tmp_path)
    Path("mlafuzz-ledger.toml").write_text(_ledger(waive=("VALUE_MISMATCH",)))
    unexpected: set[str] = set()
    for k in shards:
        monkeypatch.setenv("MLAFUZZ_SHARD", f"{k}/{count}")
        monkeypatch.setenv("MLAFUZZ_SEED", str(SEED))
        assert _sh(fuzz_step, **{"matrix.shard": str(k)}) in (0, 1)
        said = re.search(r"(\d+) expected findings?, (\d+) unexpected in (\d+) buckets?", capsys.readouterr().err)
        assert said and int(said.group(3)) <= 1, f"shard {k}: {said}"  # the ledgered bucket is not unexpected
        unexpected |= {
            json.loads(line)["kind"]
            for line in Path(f"out-{k}/findings.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] != "VALUE_MISMATCH"
        }
    found = {json.loads(ln)["kind"] for k in shards for ln in Path(f"out-{k}/findings.jsonl").read_text().splitlines()}
    assert found == {"VALUE_MISMATCH", "NAN_MISMATCH"}  # both planted bugs showed: the test can tell them apart

    _fresh_merge_job()  # the merge job has no copy of the ledger: the shards recorded it
    assert _sh(merge_step) == 1  # an unexpected bucket fails the job
    suite = _junit(tmp_path / "fuzz.xml")
    failures = [f.get("message", "") for f in suite.iter("failure")]
    assert len(failures) == len(unexpected) == 1 and "NAN_MISMATCH" in failures[0]
    assert suite.get("errors") == "0"
    assert "[expected] VALUE_MISMATCH" in "".join(t.text or "" for t in suite.iter("system-out"))

    _fresh_merge_job(f"out-{shards[-1]}")  # one shard's upload never arrived
    assert _sh(merge_step) == 1
    err = capsys.readouterr().err
    assert f"warning: partial: shard {shards[-1]}/{count} of the run's {count} missing" in err
    summary = json.loads(Path("merged/summary.json").read_text())
    assert summary["partial"] is True and summary["missing_shards"] == [f"{shards[-1]}/{count}"]
    (error,) = _junit(tmp_path / "fuzz.xml").iter("error")
    assert error.get("message") == f"incomplete run: shard {shards[-1]}/{count} missing from the merge"


def test_the_buildkite_recipe_reports_a_cancelled_shard_as_stopped_and_passes_once_every_bucket_is_ledgered(
    tmp_path, monkeypatch, capsys
):
    block, fuzz_step, merge_step = _recipes()["buildkite"]
    count = int(re.search(r"parallelism: (\d+)", block).group(1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BUILDKITE_BUILD_NUMBER", str(SEED))
    monkeypatch.setenv("BUILDKITE_PARALLEL_JOB_COUNT", str(count))
    ledger = _ledger(waive=("VALUE_MISMATCH", "NAN_MISMATCH"))

    def shard(k: int, *, cancel_at: int | None = None) -> int:
        Path("mlafuzz-ledger.toml").write_text(ledger)
        monkeypatch.setenv("BUILDKITE_PARALLEL_JOB", str(k))
        if cancel_at is None:
            monkeypatch.delenv("SIGTERM_AFTER_CALLS", raising=False)
        else:
            monkeypatch.setenv("SIGTERM_AFTER_CALLS", str(cancel_at))
        return _sh(fuzz_step)

    for k in range(count - 1):
        assert shard(k) == 0  # every bucket is ledgered
    assert shard(count - 1, cancel_at=2) == 143  # CI cancelled it mid-run
    _fresh_merge_job()
    capsys.readouterr()
    assert _sh(merge_step) == 1  # a stopped shard fails the job
    assert f"out-{count - 1} was stopped" in capsys.readouterr().err
    suite = _junit(tmp_path / "fuzz.xml")
    assert suite.get("failures") == "0"
    (error,) = suite.iter("error")
    assert error.get("message", "").startswith("incomplete run: stopped by SIGTERM after")
    assert main(["report", "merged", "--format", "md"]) == 1
    headline = capsys.readouterr().out.splitlines()[0]
    assert "stopped run" in headline and "passed" not in headline

    shutil.rmtree(f"out-{count - 1}")  # the retried job, on a fresh machine
    assert shard(count - 1) == 0
    _fresh_merge_job()
    assert _sh(merge_step) == 0
    suite = _junit(tmp_path / "fuzz.xml")
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")

"""The run folder (--out) as a CI job meets it: checked before any worker starts, never mixed
with an earlier run, replaced with --overwrite, continued with --resume, the default one a scratch
folder; every file written with the user's umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mlafuzz.harness.cli.main import main

SKIP_LAST_ROW = "gather=gather_skip_last_row"  # a finding in most cases: every case leaves a line


def _fuzz(out: Path | None, *extra: str, cases: int = 4, seed: int = 0) -> int:
    argv = [
        "fuzz",
        "--op",
        "gather",
        "--impl",
        SKIP_LAST_ROW,
        "--device",
        "cpu",
        "--cases",
        str(cases),
        "--seed",
        str(seed),
        "--in-process",
        "--shrink-budget",
        "0",
        "--quiet",
        *extra,
    ]
    return main(argv + (["--out", str(out)] if out is not None else []))


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines()]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture
def no_workers(monkeypatch):
    """Any worker start fails the test: what is checked must be checked before that."""
    from mlafuzz.harness.drive import workers

    def refuse(*args, **kwargs):
        raise AssertionError("a worker pool was started")

    monkeypatch.setattr(workers.WorkerPool, "__init__", refuse)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda tmp: (tmp / "a_file").write_text("x") and tmp / "a_file", "is a file, not a folder"),
        (lambda tmp: (tmp / "a_file").write_text("x") and tmp / "a_file" / "sub", "cannot be created"),
        (lambda tmp: Path("/proc/mlafuzz-no-such-dir/run"), "cannot be created"),
    ],
)
def test_an_out_that_cannot_hold_a_run_is_one_line_exit_2_before_any_worker_starts(
    make, needle, tmp_path, capsys, no_workers
):
    out = make(tmp_path)
    rc = main(["fuzz", "--op", "gather", "--device", "cpu", "--cases", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err


def test_a_used_out_is_refused_before_any_worker_starts_and_kept_as_it_was(tmp_path, capsys, no_workers):
    assert _fuzz(tmp_path) == 1  # in-process: no pool
    before = (tmp_path / "findings.jsonl").read_text()
    capsys.readouterr()
    assert main(["fuzz", "--op", "gather", "--device", "cpu", "--cases", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds an earlier run" in err and "--overwrite" in err and "--resume" in err
    assert len(err.splitlines()) == 1
    assert (tmp_path / "findings.jsonl").read_text() == before


def test_overwrite_replaces_the_earlier_run_so_lines_and_summary_agree(tmp_path):
    assert _fuzz(tmp_path, cases=6) == 1
    (tmp_path / "bundles" / "old").mkdir(parents=True)
    (tmp_path / "bundles" / "old" / "case.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("the user's own file")
    assert _fuzz(tmp_path, "--overwrite", cases=4, seed=1) == 1
    summary = _summary(tmp_path)
    assert summary["cases"] == 4 and len(_lines(tmp_path)) == summary["findings"]
    assert not (tmp_path / "bundles" / "old").exists()  # the earlier run's bundles went with it
    assert sorted(p.name for p in (tmp_path / "bundles").iterdir()) == sorted(
        Path(b["path"]).name for b in summary["bundles"]
    )  # this run's own, each bucket bundled as found (--shrink-budget 0)
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"  # nothing else did


def test_resume_goes_on_where_the_run_stopped_so_nothing_is_rerun_and_counts_add_up(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert _fuzz(whole, cases=8) == 1
    assert _fuzz(parts, cases=5) == 1
    assert _fuzz(parts, "--resume", cases=3) == 1
    one, two = _summary(whole), _summary(parts)
    for key in ("cases", "findings", "per_op", "by_kind", "coverage", "bucket_counts", "next_case"):
        assert two[key] == one[key], key
    assert two["sessions"] == 2
    assert sorted(f["case_id"] for f in _lines(parts)) == sorted(f["case_id"] for f in _lines(whole))


def test_resume_of_another_run_is_refused_in_one_line(tmp_path, capsys):
    assert _fuzz(tmp_path, seed=0) == 1
    capsys.readouterr()
    assert _fuzz(tmp_path, "--resume", seed=3) == 2
    err = capsys.readouterr().err.strip()
    assert "holds another run" in err and "seed" in err and len(err.splitlines()) == 1


def test_resume_of_an_empty_folder_starts_the_run(tmp_path):
    assert _fuzz(tmp_path / "fresh", "--resume") == 1
    assert _summary(tmp_path / "fresh")["sessions"] == 1


def test_the_default_out_is_a_scratch_folder_cleared_with_a_note(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _fuzz(None) == 1
    first = _summary(tmp_path / "mlafuzz-out")
    capsys.readouterr()
    assert (
        main(
            [
                "fuzz",
                "--op",
                "gather",
                "--impl",
                SKIP_LAST_ROW,
                "--device",
                "cpu",
                "--cases",
                "4",
                "--in-process",
                "--shrink-budget",
                "0",
            ]
        )
        == 1
    )
    assert "cleared the earlier run in ./mlafuzz-out" in capsys.readouterr().err
    out = tmp_path / "mlafuzz-out"
    assert _summary(out)["findings"] == first["findings"] == len(_lines(out))


def test_every_file_of_a_run_gets_the_users_umask(tmp_path):
    old = os.umask(0o027)
    try:
        rc = main(
            [
                "fuzz",
                "--op",
                "gather",
                "--impl",
                SKIP_LAST_ROW,
                "--device",
                "cpu",
                "--cases",
                "4",
                "--in-process",
                "--shrink-budget",
                "2",
                "--quiet",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        assert rc == 1
        report = ["report", str(tmp_path / "run"), "--format", "html", "-o", str(tmp_path / "run" / "r.html")]
        assert main(report) == 1  # written; the run failed
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"findings.jsonl", "summary.json", "run.json", "r.html", "case.json", "inputs.pt"} <= names
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: oct(0o640) for p in files}


def test_a_stopped_run_resumes_with_the_cases_it_left_in_flight(tmp_path):
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
    from mlafuzz.harness.drive.resume import load_resume
    from mlafuzz.harness.drive.workers import InProcess
    from mlafuzz.harness.ops.table import OPS

    class StopsAtCase3(InProcess):
        """Ctrl-C arrives while case 3 is in flight."""

        def submit(self, task):
            if task.index == 3 and not getattr(self, "stopped", False):
                self.stopped = True
                raise KeyboardInterrupt
            super().submit(task)

    session = Session(table=OPS)

    def config(out: Path, cases: int) -> FuzzConfig:
        return FuzzConfig(ops=("gather",), impls={"gather": "gather_skip_last_row"}, cases=cases, out_dir=out)

    first = fuzz(config(tmp_path / "parts", 8), executor=StopsAtCase3(session=session))
    assert first.interrupted and first.cases == 3 and first.unfinished == (3,) and first.next_case == 4
    resume = load_resume(tmp_path / "parts", config(tmp_path / "parts", 5).run_json())
    second = fuzz(config(tmp_path / "parts", 5), executor=InProcess(session=session), resume=resume)
    whole = fuzz(config(tmp_path / "whole", 8), executor=InProcess(session=session))
    assert second.to_json()["cases"] == whole.cases == 8
    assert second.bucket_counts == whole.bucket_counts and second.next_case == whole.next_case

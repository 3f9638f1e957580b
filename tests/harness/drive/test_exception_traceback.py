"""Debugging an EXCEPTION finding: it carries the implementation's traceback, its own frames only,
in findings.jsonl and the bundle, and fuzz and replay show where it raised."""

from __future__ import annotations

import json

from mlafuzz.harness.cli.main import main

RAISES = """
def _check(n):
    raise ValueError(f"cannot gather {n} requests")


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    _check(batch_size)
"""


def test_an_exception_finding_carries_the_implementations_own_traceback_to_fuzz_and_replay(tmp_path, capsys):
    impl = tmp_path / "raising_gather.py"
    impl.write_text(RAISES)
    out = tmp_path / "run"
    argv = ["fuzz", "--impl", f"gather={impl}:gather", "--device", "cpu", "--in-process", "--cases", "3"]
    assert main(argv + ["--shrink-budget", "0", "--out", str(out)]) == 1
    printed = "".join(capsys.readouterr())
    assert "raising_gather.py:3 in _check" in printed  # the finding line says where it raised

    [line] = [json.loads(x) for x in (out / "findings.jsonl").read_text().splitlines()][:1]
    tb = line["extra"]["traceback"]
    assert tb[-1].startswith("ValueError: cannot gather")
    frames = [t for t in tb if t.strip().startswith('File "')]
    assert frames and all(str(impl) in f for f in frames), tb  # no harness frame left
    assert [f.split(", in ")[-1] for f in frames] == ["gather", "_check"]

    [bundle] = list((out / "bundles").iterdir())
    assert json.loads((bundle / "finding.json").read_text())["extra"]["traceback"] == tb
    assert main(["replay", str(bundle), "--trust-bundle"]) == 1
    replayed = capsys.readouterr().out
    assert 'raising_gather.py", line 3, in _check' in replayed and "cannot gather" in replayed

"""The planted look-alike of vLLM's constexpr-specializing convert, fuzzed on the CPU (interpreter).

On the H200 the lead measures its cases/s beside ours (issue #29); here it must be judged like any
user's Triton convert: the post-#48642 entry point is clean, and the pre-fix launch (a grid over
req_id's rows, no length check) is caught by the length_mismatch error input."""

from __future__ import annotations

import json
from pathlib import Path

from mlafuzz.harness.cli.main import main

LOOKALIKE = Path(__file__).parents[1] / "support" / "planted" / "vllm_like_convert.py"


def _fuzz(tmp_path: Path, attr: str, cases: int) -> tuple[int, list[dict]]:
    out = tmp_path / attr
    rc = main(
        [
            "fuzz",
            "--op",
            "convert",
            "--impl",
            f"convert={LOOKALIKE}:{attr}",
            "--device",
            "cpu",
            "--cases",
            str(cases),
            "--shrink-budget",
            "0",
            "--out",
            str(out),
            "--quiet",
            "--revision",  # the look-alike keeps a counted row in place, as vLLM up to 0.29
            "2026-10",
        ]
    )
    lines = (out / "findings.jsonl").read_text().splitlines() if (out / "findings.jsonl").exists() else []
    return rc, [json.loads(x) for x in lines]


def test_the_vllm_like_convert_with_the_length_check_draws_no_finding(tmp_path):
    rc, found = _fuzz(tmp_path, "convert", 24)
    assert rc == 0
    assert [f for f in found if f["severity"] == "error"] == []


def test_the_vllm_like_launch_before_pr_48642_is_caught_accepting_a_longer_req_id(tmp_path):
    # Case 1 is the run's first error input, length_mismatch (fuzz.py's rotation); case 2 would
    # run in a worker whose heap that input's write past ``out`` may have broken. Under the CPU
    # interpreter that write lands in the worker's own heap: it either runs on (the input was
    # accepted) or takes the worker down first (a crash charged to the same input class).
    rc, found = _fuzz(tmp_path, "convert_prefix_bug", 2)
    errors = [(f["kind"], f["cause"]) for f in found if f["severity"] == "error"]
    assert rc == 1
    assert errors in (
        [("ACCEPTED_INVALID_INPUT", "contract:length_mismatch")],
        [("CRASH", "contract:length_mismatch:crash")],
    ), errors

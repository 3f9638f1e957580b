"""Issue 16's rate check, for `bash .ci/gpu crashrate`: a crash-prone error-input class must cost
the run one worker restart, not its valid-input rate.

    python .ci/crashrate.py BASELINE_RUN_DIR CRASHING_RUN_DIR

Reads both runs' summary.json. The rate compared is valid inputs per second: ``cases`` counts
the valid cases (each task runs exactly one; its error input, on every third case of an op, is
extra work inside the same task, not a case), over the run's wall time. Passes when the crashing
run (gather_cpp_throw) keeps >= 80% of the baseline's rate (gather=cuda, the same kernel on
valid inputs), drew exactly one CRASH, quarantined its class, and restarted one worker.
"""

import json
import sys
from pathlib import Path


def load(run: str) -> dict:
    summary = json.loads((Path(run) / "summary.json").read_text())
    lines = (Path(run) / "findings.jsonl").read_text().splitlines()
    summary["crashes"] = sum(json.loads(line)["kind"] == "CRASH" for line in lines if line.strip())
    return summary


def main(baseline: str, crashing: str) -> int:
    base, crash = load(baseline), load(crashing)
    ratio = crash["cases_per_second"] / base["cases_per_second"] if base["cases_per_second"] else 0.0
    for name, s in (("baseline", base), ("crashing", crash)):
        print(
            f"{name:<9} {s['cases']:>6} valid cases in {s['seconds']:6.1f} s = {s['cases_per_second']:7.2f} cases/s;"
            f" {s['crashes']} CRASH, {s['worker_restarts']} worker restarts, quarantined {s['quarantined']}"
        )
    problems = []
    if ratio < 0.8:
        problems.append(f"valid-input rate {ratio:.2f}x of the baseline's (< 0.80)")
    if crash["crashes"] != 1 or crash["worker_restarts"] != 1 or len(crash["quarantined"]) != 1:
        problems.append("the crashing run must show exactly 1 CRASH, 1 worker restart, 1 quarantined class")
    if base["crashes"] or base["worker_restarts"]:
        problems.append("the baseline run crashed")
    print(f"crashrate: ratio {ratio:.2f}x {'OK' if not problems else 'FAIL: ' + '; '.join(problems)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

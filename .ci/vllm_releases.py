"""The release tier's driver (run it through .ci/vllm_releases.sh, which picks its Python).

For each vLLM release: the wheel (downloaded once with ``pip download --no-deps``), its op
modules built into an importable tree behind our shim (``mlafuzz.kernels.vllm_release``), then
``mlafuzz fuzz --impl OP=vllm`` for each op whose vLLM code is Python or Triton, with the tree on
PYTHONPATH, exactly as a user with that vLLM installed runs it: ``--revision auto`` (the
default for an --impl vllm) reads the tree's ``vllm.__version__``. Prints one row per release
x op and exits 1 when any finding is not in the ledger (2 when a run could not be made).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mlafuzz.harness.ledger import judge, load_ledger
from mlafuzz.harness.ops.table import OPS
from mlafuzz.kernels.vllm_release.tree import build_tree
from mlafuzz.reports.findings import Finding, Severity

RELEASES = ("0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
# The ops whose vLLM code is Python (plan) or Triton (convert, dcp). gather and writer are CUDA
# ops in vLLM's compiled extension, which these wheels build for torch 2.13/2.14: fuzz them from
# a user's own install. dcp_peer is in no release; prepare_sparse_mla_safe_lengths (0.31.0 on)
# has no op row.
CASES = {"plan": 5000, "convert": 300, "dcp": 300}
# The DCP filter is held to the length check PR #48642 gave the convert (SPEC 10: it has none).
EXTRA_PROMISES = {"dcp": ("length_mismatch",)}
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class Row:
    release: str
    op: str
    revision: str = ""
    cases: int = 0
    rate: float = 0.0
    findings: str = ""
    verdict: str = ""


def wheel_of(cache: Path, version: str, pip: str) -> Path:
    """The release's wheel in the cache, downloaded when missing."""
    folder = cache / "vllm" / "wheels"
    found = sorted(glob.glob(str(folder / f"vllm-{version}-*.whl")))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        print(f"vllm_releases: pip download --no-deps vllm=={version}", file=sys.stderr)
        subprocess.run(
            [*shlex.split(pip), "download", "--no-deps", "-q", "-d", str(folder), f"vllm=={version}"], check=True
        )
        found = sorted(glob.glob(str(folder / f"vllm-{version}-*.whl")))
    return Path(found[-1])


def tree_of(cache: Path, version: str, pip: str) -> Path:
    """The release's importable tree: rebuilt from its wheel (so it never lags the shim), or, on a
    machine with the tree but not the wheel (a GPU machine the trees were carried to), as it is."""
    root = cache / "vllm" / version / "tree"
    have_wheel = bool(glob.glob(str(cache / "vllm" / "wheels" / f"vllm-{version}-*.whl")))
    if not have_wheel and (root / "tree.json").is_file():
        return root
    return build_tree(wheel=wheel_of(cache, version, pip), root=root, version=version)


def fuzz_one(*, tree: Path, release: str, op: str, cases: int, args: argparse.Namespace) -> Row:
    out = Path(args.out) / release / op
    contract = []
    if op in EXTRA_PROMISES:
        promised = sorted(OPS.get(op).contract | set(EXTRA_PROMISES[op]))
        contract = ["--contract", f"{op}={','.join(promised)}"]
    cmd = [sys.executable, "-m", "mlafuzz.harness.cli", "fuzz", "--impl", f"{op}=vllm", "--cases", str(cases)]
    cmd += ["--seed", str(args.seed), "--device", args.device, "--out", str(out), "--overwrite", *contract]
    cmd += ["--ledger", args.ledger] if args.ledger else []
    cmd += ["--workers", str(args.workers)] if args.workers else []
    env = {k: v for k, v in os.environ.items() if k != "MLAFUZZ_VLLM_VERSION"}  # the tree's __version__ says
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(out.parent / f"{op}.log", "w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    text = (out.parent / f"{op}.log").read_text()
    if rc == 2:
        absent = "has no" in text and "implementation" in text
        return Row(release=release, op=op, verdict="not in this release" if absent else f"error: {last_line(text)}")
    run = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return Row(
        release=release,
        op=op,
        revision=run.get("revision", ""),
        cases=summary["cases"],
        rate=summary["cases"] / max(summary.get("seconds") or (time.monotonic() - started), 1e-9),
        findings=findings_text(out, args.ledger),
        verdict={0: "pass", 1: "FAIL"}.get(rc, f"exit {rc}"),
    )


def findings_text(out: Path, ledger_path: str) -> str:
    """Errors by kind, the ledger's in brackets; infos counted apart."""
    path = out / "findings.jsonl"
    found = [Finding.from_json(json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []
    judgement = judge(found, ledger=load_ledger(ledger_path) if ledger_path else None)
    kinds: dict[str, list[int]] = {}
    infos = 0
    for f in found:
        if f.severity == Severity.INFO:
            infos += 1
            continue
        waived = judgement.statuses.get(f.dedup_key) == "expected"
        kinds.setdefault(f.kind.value, [0, 0])[waived] += 1
    parts = [f"{k} {n + w}" + (f" (ledger {w})" if w else "") for k, (n, w) in sorted(kinds.items())]
    return ", ".join(parts + ([f"{infos} info"] if infos else [])) or "0"


def last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:160] if lines else ""


def table(rows: list[Row]) -> str:
    head = "| release | op | revision | cases | cases/s | findings | verdict |\n|---|---|---|---:|---:|---|---|"
    body = [
        f"| {r.release} | {r.op} | {r.revision or '-'} | {r.cases or '-'} | {f'{r.rate:.1f}' if r.cases else '-'}"
        f" | {r.findings or '-'} | {r.verdict} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("versions", nargs="*", default=list(RELEASES), help="vLLM releases (default 0.27.0 .. 0.34.0)")
    p.add_argument("--device", default="cpu", help="cpu (Triton's interpreter) or cuda")
    p.add_argument("--cases", default="", help="per op, e.g. convert=100,dcp=100,plan=2000 (default 300/300/5000)")
    p.add_argument("--ops", default="plan,convert,dcp", help="ops to fuzz (default plan,convert,dcp)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="mlafuzz-releases", help="run folders: OUT/RELEASE/OP")
    p.add_argument("--ledger", default=str(ROOT / ".ci" / "vllm_releases_ledger.toml"))
    p.add_argument("--cache", default=os.environ.get("MLAFUZZ_CACHE") or str(Path.home() / ".cache" / "mlafuzz"))
    p.add_argument("--pip", default=f"{sys.executable} -m pip", help="the pip that downloads wheels")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="releases fuzzed at once (default 1). On a GPU machine most of a release's time is Triton"
        " compiling its kernels and workers starting, so 4 jobs of 2 workers each finish the table in a"
        " fraction of the time; each row's cases/s is then measured beside the others",
    )
    p.add_argument("--workers", type=int, default=None, help="fuzz --workers for each run (default: fuzz's own)")
    args = p.parse_args(argv)
    cases = dict(CASES)
    for item in filter(None, args.cases.split(",")):
        op, _, n = item.partition("=")
        if op not in CASES or not n.isdigit():
            p.error(f"--cases {item!r}: expected OP=N with OP one of {', '.join(CASES)}")
        cases[op] = int(n)
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in CASES]
    if bad:
        p.error(f"--ops {bad[0]!r}: the tier fuzzes {', '.join(CASES)}")
    import triton

    print(
        f"vllm_releases: {', '.join(args.versions)} on {args.device}, Triton {triton.__version__}, seed {args.seed}",
        file=sys.stderr,
    )
    if args.jobs < 1 or (args.workers is not None and args.workers < 1):
        p.error("--jobs and --workers take a whole number >= 1")

    def release(version: str) -> list[Row]:
        tree = tree_of(Path(args.cache), version, args.pip)
        done = []
        for op in ops:
            row = fuzz_one(tree=tree, release=version, op=op, cases=cases[op], args=args)
            print(f"vllm_releases: {version} {op}: {row.verdict} ({row.findings or '-'})", file=sys.stderr, flush=True)
            done.append(row)
        return done

    # Releases are independent runs (each its own out folder and PYTHONPATH); the table keeps their order.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = [row for rows_of in pool.map(release, args.versions) for row in rows_of]
    print(table(rows))
    if any(r.verdict.startswith(("error", "exit")) for r in rows):
        return 2
    return 1 if any(r.verdict == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

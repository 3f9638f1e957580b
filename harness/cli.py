"""The ``mlafuzz`` command line.

Exit codes: 0 nothing found, 1 findings, 2 a usage or environment error (one
line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A user mistake: reported as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage dump
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _shard(text: str):
    from mlafuzz.harness.fuzz import Shard

    k, sep, n = text.partition("/")
    try:
        return Shard(index=int(k), count=int(n))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {text!r}") from None


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("mlafuzz: --device cuda but no CUDA device is available here (use --device cpu)")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


DEFAULT_IMPLS: dict[str, dict[str, str]] = {
    "cpu": {"convert": "triton", "gather": "torch", "writer": "torch", "step": "ours"},
    "cuda": {"convert": "triton", "gather": "cuda", "writer": "cuda", "step": "ours"},
}


def _select_impls(args: argparse.Namespace, ops: list[str]) -> dict[str, str]:
    """op -> --impl reference, each resolved and loaded once here so mistakes surface as one line."""
    from mlafuzz.kernels.registry import ImplError, parse_impl_arg, resolve

    chosen: dict[str, str] = {}
    for text in args.impl or ():
        op, ref = parse_impl_arg(text)
        chosen[op] = ref
    refs = {}
    for op in ops:
        ref = chosen.get(op, DEFAULT_IMPLS[args.device].get(op))
        if ref is None:
            raise ImplError(f"no default implementation of op {op!r} on {args.device}; pass --impl {op}=...")
        entry = resolve(op, ref)
        try:
            entry.load(args.device)
        except ImplError:
            raise
        except Exception as exc:  # e.g. the CUDA extension failed to build: one line, exit 2
            raise ImplError(f"--impl {op}={ref}: cannot load on {args.device}: {type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
        refs[op] = ref
    return refs


def _executor(args: argparse.Namespace):
    from mlafuzz.harness.workers import InProcess, WorkerPool, device_slots

    if (args.redzone or args.sanitizer) and args.device != "cuda":
        raise UsageError("mlafuzz: --redzone and --sanitizer check GPU memory: use them with --device cuda")
    if args.sanitizer:
        from mlafuzz.harness.sanitizer import SanitizerExecutor

        try:
            return SanitizerExecutor(device=args.device)
        except RuntimeError as exc:
            raise UsageError(f"mlafuzz: {exc}") from None
    if args.in_process:
        if args.redzone:
            from mlafuzz.harness import redzone

            redzone.install()
        return InProcess()
    return WorkerPool(devices=device_slots(device=args.device, workers=args.workers), timeout=args.timeout,
                      redzone=args.redzone)


def cmd_fuzz(args: argparse.Namespace) -> int:
    from mlafuzz.generators.draw import KNOB_PRESETS
    from mlafuzz.generators.spec import spec_from_json
    from mlafuzz.harness.compare import Policy
    from mlafuzz.harness.fuzz import FuzzConfig, fuzz
    from mlafuzz.harness.ops import fuzzable_ops
    from mlafuzz.harness.progress import Progress
    from mlafuzz.kernels.registry import parse_impl_arg

    args.device = args.device or default_device()
    _check_device(args.device)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports triton
    fixed_spec = None
    if args.spec:
        path = Path(args.spec)
        if not path.is_file():
            raise UsageError(f"mlafuzz: --spec {args.spec!r}: no such file")
        fixed_spec = spec_from_json(path.read_text())
        ops = [fixed_spec.op]
    elif args.op:
        ops = list(dict.fromkeys(args.op))
    elif args.impl:
        ops = list(dict.fromkeys(parse_impl_arg(t)[0] for t in args.impl))
    else:
        ops = fuzzable_ops()
    unknown = [op for op in ops if op not in fuzzable_ops()]
    if unknown:
        raise UsageError(f"mlafuzz: op {unknown[0]!r} cannot be fuzzed (fuzzable: {', '.join(fuzzable_ops())})")
    cases, budget = args.cases, args.budget
    if cases is None and budget is None:
        budget = 60.0
    from mlafuzz.harness.ledger import LedgerError, load_ledger

    try:
        ledger = load_ledger(args.ledger) if args.ledger else None
    except LedgerError as exc:
        raise UsageError(f"mlafuzz: --ledger: {exc}") from None
    rejects = {}
    for text in args.contract or ():
        op, _, classes = text.partition("=")
        rejects[op] = tuple(c for c in classes.split(",") if c)
    config = FuzzConfig(ops=tuple(ops), impls=_select_impls(args, ops), device=args.device, cases=cases,
                        budget=budget, seed=args.seed, out_dir=Path(args.out), knobs=KNOB_PRESETS[args.size],
                        policy=Policy(ulp=args.ulp), fixed_spec=fixed_spec, shard=args.shard,
                        shrink_budget=args.shrink_budget, rejects=rejects)
    impl_text = ", ".join(f"{op}={ref}" for op, ref in config.impls.items())
    if not args.quiet:
        limit = " / ".join(x for x in (f"{cases} cases" if cases is not None else "",
                                        f"{budget:.0f} s budget" if budget is not None else "") if x)
        print(f"mlafuzz: fuzzing {impl_text} on {args.device}, seed {args.seed}, {limit};"
              f" findings -> {config.out_dir}/findings.jsonl", file=sys.stderr)
    seen: set = set()
    found: list = []  # for the ledger's verdict

    def show(finding) -> None:
        found.append(finding)
        if not args.quiet and finding.dedup_key not in seen:  # one line per new bucket
            seen.add(finding.dedup_key)
            print(f"  {finding.kind.value} {finding.op}={finding.impl} {finding.case_id}: {finding.message}",
                  file=sys.stderr)

    executor = _executor(args)
    progress = Progress(budget=budget, quiet=args.quiet)
    try:
        summary = fuzz(config, executor=executor, on_finding=show, on_progress=progress)
    finally:
        progress.close()
        executor.close()
    for bundle in summary.bundles:
        size = ", ".join(f"{k} {v}" for k, v in bundle["size"].items())
        print(f"  repro ({size}): {bundle['replay']}")
    print(summary.line())
    if ledger is not None:
        verdict = ledger.verdict(found, ran=config.impls.items())
        for line in verdict.lines():
            print(line, file=sys.stderr)
        if verdict.failed:
            return EXIT_FINDINGS
        return 130 if summary.interrupted else EXIT_OK
    if summary.findings:
        return EXIT_FINDINGS
    return 130 if summary.interrupted else EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    from mlafuzz.harness.replay import replay

    return replay(bundle_path=Path(args.bundle), impl=args.impl, device=args.device, quiet=args.quiet)


def cmd_list(args: argparse.Namespace) -> int:
    from mlafuzz.harness.ops import fuzzable_ops
    from mlafuzz.kernels.registry import OPS, REGISTRY, _ensure_builtins
    from mlafuzz.kernels.vllm_loader import CANDIDATES as VLLM_CANDIDATES

    _ensure_builtins()
    fuzzable = set(fuzzable_ops())
    for op in OPS:
        print(f"{op}{'' if op in fuzzable else '  (not fuzzable yet)'}")
        for e in REGISTRY.entries(op=op):
            tag = f" [mutant, expects {e.expected_kind}]" if e.is_mutant else ""
            print(f"  {e.name:<28} devices={','.join(sorted(e.devices)):<9} {e.description}{tag}")
        if op in VLLM_CANDIDATES:
            print(f"  {'vllm':<28} devices=cuda      vLLM's own, from an installed vllm")
    print("external: --impl OP=package.module:attr or --impl OP=path/to/file.py:attr")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise UsageError("mlafuzz: bench measures GPU kernels: no CUDA device is available here")
    from mlafuzz.harness.bench import bench_harness, bench_kernels

    ops = list(dict.fromkeys(args.op or ["convert", "gather", "writer"]))
    if args.harness:
        lines = bench_harness(ops, cases=args.cases, profile=args.profile)
    else:
        lines = bench_kernels(ops, repeats=args.repeats, variants=args.variants)
    print(f"mlafuzz bench on {torch.cuda.get_device_name()}")
    for line in lines:
        print(line)
    return EXIT_OK


def cmd_mutants(args: argparse.Namespace) -> int:
    from mlafuzz.harness.mutants_cmd import render, run_mutants
    from mlafuzz.harness.ops import fuzzable_ops
    from mlafuzz.harness.workers import InProcess, WorkerPool

    args.device = args.device or default_device()
    _check_device(args.device)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")

    def make_executor():
        # On the GPU a mutant may write out of bounds: isolate it, with the red-zone allocator on.
        if args.device == "cuda":
            return WorkerPool(devices=["cuda:0"], timeout=120.0, redzone=True)
        return InProcess()

    ops = list(dict.fromkeys(args.op or ["convert", "gather", "writer", "step"]))
    executor = make_executor()  # one warm executor for the whole catalog; a dead worker is replaced
    try:
        results, clean = run_mutants(ops=ops, device=args.device, budget=args.budget_per_mutant,
                                     out=Path(args.out), seed=args.seed, shrink_budget=args.shrink_budget,
                                     executor=executor, fuzz_ops=fuzzable_ops())
    finally:
        executor.close()
    for line in render(results):
        print(line)
    for problem in clean:
        print(f"correct implementation drew findings: {problem}")
    if not clean:
        print(f"correct implementations ({', '.join(o for o in ops if o in fuzzable_ops())}): no findings")
    return EXIT_FINDINGS if clean or not all(r.killed for r in results) else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mlafuzz", description="Differential fuzzer for sparse-MLA fp8_ds_mla KV-cache kernels: random "
                "decode/prefill batches through the implementation under test and exact PyTorch oracles.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    f = sub.add_parser("fuzz", help="fuzz implementations against the oracles",
                       description="Fuzz implementations against the oracles. Exit 0: nothing found; 1: findings "
                       "(appended to OUT/findings.jsonl as they happen); 2: usage or environment error.")
    f.add_argument("--op", action="append", choices=("convert", "gather", "writer", "step"),
                   help="op to fuzz (repeatable); default: every op with an --impl, else all fuzzable ops")
    f.add_argument("--impl", action="append", metavar="OP=REF",
                   help="implementation per op: a registered name (see `mlafuzz list`), vllm, module:attr or "
                        "path/to/file.py:attr (repeatable); default: ours for the device")
    f.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    f.add_argument("--cases", type=_nonneg_int, help="number of cases to run (this shard)")
    f.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                   help="wall-clock budget; default 60 s when --cases is not given either")
    f.add_argument("--seed", type=_nonneg_int, default=0, help="run seed: same seed, same cases (default 0)")
    f.add_argument("--out", default="mlafuzz-out", metavar="DIR", help="run directory (default ./mlafuzz-out)")
    f.add_argument("--spec", metavar="FILE", help="run this spec (JSON, as in a repro bundle) with varying seeds")
    f.add_argument("--size", choices=("small", "large"), default="small",
                   help="case size knobs: small (CPU, interpreter) or large (realistic GPU sizes)")
    f.add_argument("--ulp", type=_nonneg_int, default=0, help="bf16 ulp budget (default 0: bit-exact)")
    f.add_argument("--shard", type=_shard, default=None, metavar="K/N", help="run only shard K of N (0-based)")
    f.add_argument("--quiet", action="store_true", help="only the closing summary line (for CI logs)")
    f.add_argument("--workers", type=_nonneg_int, default=None,
                   help="worker processes (default: one per GPU with --device cuda, 1 on cpu)")
    f.add_argument("--in-process", action="store_true",
                   help="run cases in this process: faster start, but a crashing impl takes the run down")
    f.add_argument("--timeout", type=_positive_float, default=120.0, metavar="SECONDS",
                   help="per-case limit before a worker is killed and the case reported as TIMEOUT (default 120)")
    f.add_argument("--shrink-budget", type=float, default=20.0, metavar="SECONDS",
                   help="time to minimize each new finding bucket before writing its repro bundle "
                        "(default 20; 0 disables shrinking and bundles)")
    f.add_argument("--redzone", action="store_true",
                   help="GPU fast mode: a red-zone allocator pads every CUDA allocation with canaries, so writes "
                        "past outputs the impl allocates itself are OOB_WRITE findings")
    f.add_argument("--sanitizer", action="store_true",
                   help="GPU exact mode: run cases under compute-sanitizer memcheck with the caching allocator "
                        "off; its reports become findings (slow)")
    f.add_argument("--contract", action="append", metavar="OP=CLASS,...",
                   help="hold an external impl to this (weaker) contract instead of SPEC's must-reject list")
    f.add_argument("--ledger", metavar="FILE",
                   help="expected-failures ledger (TOML or JSON): findings it lists don't fail the run; "
                        "entries that matched nothing are printed as stale")
    f.set_defaults(func=cmd_fuzz)

    r = sub.add_parser("replay", help="replay a repro bundle",
                       description="Replay a repro bundle. Exit 1 while its finding reproduces, 0 once fixed, "
                                   "2 for a malformed or tampered bundle.")
    r.add_argument("bundle", help="bundle directory (OUT/bundles/...)")
    r.add_argument("--impl", metavar="OP=REF", help="replay against another implementation (e.g. the fix)")
    r.add_argument("--device", choices=("cpu", "cuda"), help="default: the bundle's device if available, else cpu")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=cmd_replay)

    b = sub.add_parser("bench", help="GPU: kernel bandwidth vs a device copy, or the harness's cost per case",
                       description="Kernel mode: effective bandwidth of our kernel and the torch implementation as "
                                   "ratios to a device-to-device copy of the same bytes (CUDA events, median after "
                                   "warm-up). --harness: cases/s and the per-stage time of checking realistic cases.")
    b.add_argument("--op", action="append", choices=("convert", "gather", "writer"))
    b.add_argument("--harness", action="store_true", help="time the harness stages instead of the kernels")
    b.add_argument("--repeats", type=_nonneg_int, default=30)
    b.add_argument("--variants", action="store_true",
                   help="also time every tuning variant of our gather (rows per warp x cache hints)")
    b.add_argument("--cases", type=_nonneg_int, default=8, help="cases per op with --harness")
    b.add_argument("--profile", action="store_true",
                   help="with --harness: also print torch.profiler tables of one checked case per op")
    b.set_defaults(func=cmd_bench)

    m = sub.add_parser("mutants", help="fuzz the catalog of planted bugs and report the mutation score",
                       description="Fuzz every planted-bug mutant until it draws its expected finding kind "
                                   "(killed) or its budget ends (survived), and the correct implementations in the "
                                   "same run. Exit 1 if a mutant survives or a correct implementation draws a finding.")
    m.add_argument("--op", action="append", choices=("convert", "gather", "writer", "step"))
    m.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available, else cpu")
    m.add_argument("--budget-per-mutant", type=_positive_float, default=30.0, metavar="SECONDS")
    m.add_argument("--shrink-budget", type=float, default=5.0, metavar="SECONDS",
                   help="time to minimize each kill, for the table's last column (0: skip)")
    m.add_argument("--seed", type=_nonneg_int, default=0)
    m.add_argument("--out", default="mlafuzz-mutants", metavar="DIR")
    m.set_defaults(func=cmd_mutants)

    ls = sub.add_parser("list", help="show ops and registered implementations")
    ls.set_defaults(func=cmd_list)

    from mlafuzz.reports.cli_cmds import add_report_parsers

    add_report_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from mlafuzz.generators.spec import SpecError
    from mlafuzz.harness.fuzz import Shard
    from mlafuzz.kernels.registry import ImplError
    from mlafuzz.harness.workers import WorkerStartError
    from mlafuzz.reports.bundle import BundleError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "shard", False) is None:
            args.shard = Shard()
        return args.func(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except (ImplError, SpecError, BundleError, WorkerStartError) as exc:
        print(f"mlafuzz: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

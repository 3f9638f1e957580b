"""``mlafuzz replay BUNDLE``: run a repro bundle's case again.

Exit 1 while the bundle's case still draws a finding (the original or another),
0 once it passes, 2 when the bundle is malformed or was tampered with (its
inputs.pt no longer matches what its spec and seed generate), or names an
external implementation that the command line did not (drive/replay.py says
why a bundle is never trusted to name code).

``mlafuzz replay DIR`` on a folder of bundles (a run's OUT/bundles, a merged
run's, or the run folder itself) replays each as a regression suite: a row per
bundle (still fails / fixed / not run, and why), exit 1 if any still fails,
else 2 if any could not run, else 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlafuzz.harness.cli.args import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, UsageError, positive_seconds
from mlafuzz.oracles import revisions


def add_parser(sub: argparse._SubParsersAction, *, names: tuple[str, ...]) -> None:
    r = sub.add_parser(
        "replay",
        help="replay a repro bundle",
        description="Replay a repro bundle. Exit 1 while its finding reproduces, 0 once fixed, "
        "2 for a malformed or tampered bundle. A bundle is data: replay runs a built-in "
        "implementation, or the one --impl names; it never imports a module or file "
        "because the bundle names it (unless --trust-bundle).",
    )
    r.add_argument(
        "bundle", help="bundle directory (OUT/bundles/...), or a folder of them (OUT/bundles, OUT): each is replayed"
    )
    r.add_argument(
        "--impl",
        action="append",
        metavar="OP=REF",
        help="replay against this implementation (e.g. the fix), instead of the bundle's; needed for a "
        "bundle that names an external module:attr or path.py:attr (repeatable: one per op)",
    )
    r.add_argument(
        "--pdb",
        action="store_true",
        help="run in this process and stop in pdb just before each call of the implementation "
        "(`s` steps into it); a post-mortem where the call raises (a CRASH or TIMEOUT case runs here too)",
    )
    r.add_argument(
        "--trust-bundle",
        action="store_true",
        help="import and run the external implementation the bundle names (only for a bundle you made)",
    )
    r.add_argument("--device", choices=("cpu", "cuda"), help="default: the bundle's device if available, else cpu")
    r.add_argument(
        "--revision",
        choices=revisions.names(),  # the revision table's, read when the parser is built
        help="contract revision to replay under (default: the bundle's; an entry's pin still wins)",
    )
    r.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="per-case limit of a CRASH or TIMEOUT replay (default: the limit the bundle's run had, else 120)",
    )
    r.add_argument("--quiet", action="store_true", help="print nothing; the exit status says it all")
    r.set_defaults(func=cmd_replay, device_from=_bundle_device)


def _bundle_device(args: argparse.Namespace) -> str:
    """The device a replay runs on when --device is not given: the bundle's (a folder's first
    bundle's), if this machine has it."""
    from mlafuzz.harness.drive.environment import cuda_available
    from mlafuzz.harness.drive.replay import bundle_dirs
    from mlafuzz.reports.bundle import read_case_json

    try:
        recorded = str(read_case_json(bundle_dirs(Path(args.bundle))[0]).get("device", "cpu"))
    except Exception:  # a malformed bundle: the replay itself says so
        recorded = "cpu"
    return "cuda" if recorded.startswith("cuda") and cuda_available() else "cpu"


def _impl_refs(texts: list[str] | None, names: tuple[str, ...]) -> dict[str, str]:
    """--impl OP=REF (repeatable) -> op -> ref; one per op."""
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.kernels.registry import parse_impl_arg

    refs: dict[str, str] = {}
    for text in texts or ():
        op, ref = parse_impl_arg(text, ops=names)
        if refs.get(op, ref) != ref:
            raise ImplError(f"--impl {op}={refs[op]} and --impl {text}: one implementation per op")
        refs[op] = ref
    return refs


def cmd_replay(args: argparse.Namespace) -> int:
    from mlafuzz.harness.drive.replay import bundle_dirs
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.reports.bundle import read_bundle

    table = table_from_ref(DEFAULT_TABLE)
    refs = _impl_refs(args.impl, table.names)
    path = Path(args.bundle)
    if not (path / "case.json").is_file() and path.is_dir():
        if args.pdb:
            raise UsageError(f"mlafuzz replay: --pdb debugs one bundle; {args.bundle} is a folder of them")
        return _replay_suite(args, bundle_dirs(path), refs, table)
    if refs:
        bundle_op = read_bundle(path).op
        if bundle_op not in refs:
            raise ImplError(f"--impl {args.impl[0]}: this bundle is for op {bundle_op!r}")
    result = _replay_one(args, path, refs, table)
    if not args.quiet:
        from mlafuzz.reports import console

        for line in console.replay_lines(
            op=result.bundle.op,
            impl_ref=result.impl_ref,
            device=result.device,
            recorded=result.bundle.finding,
            found=result.found,
            revision=result.revision,
        ):
            print(line)
    return EXIT_OK if result.passed else EXIT_FINDINGS


def _replay_one(args: argparse.Namespace, path: Path, refs: dict[str, str], table):
    from mlafuzz.harness.drive.replay import replay
    from mlafuzz.reports.bundle import read_case_json

    impl_ref = refs.get(str(read_case_json(path).get("op", ""))) if refs else None
    try:
        return replay(
            bundle_path=path,
            impl_ref=impl_ref,
            device=args.device,
            table=table,
            revision=args.revision,
            timeout=args.timeout,
            trust_bundle=args.trust_bundle,
            debug=args.pdb,
        )
    except OSError as exc:
        raise UsageError(f"mlafuzz replay: {path}: {exc.strerror or exc}") from None


def _replay_suite(args: argparse.Namespace, dirs: list[Path], refs: dict[str, str], table) -> int:
    """Each bundle in ``dirs``, a row each; a bundle that cannot run is a row too (not the end)."""
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.reports.bundle import BundleError, read_case_json
    from mlafuzz.reports.console import plural

    rows: list[tuple[str, str, str, str]] = []
    for d in dirs:
        try:
            kind = str(json.loads((d / "finding.json").read_text(encoding="utf-8")).get("kind", "?"))
        except (OSError, ValueError, AttributeError):
            kind = "?"
        try:
            case = read_case_json(d)
            result = _replay_one(args, d, refs, table)
        except (BundleError, ImplError, UsageError, OSError, ValueError) as exc:
            rows.append((d.name, kind, "not run", " ".join(str(exc).split())))
            continue
        what = f"{case.get('op')}={result.impl_ref}"
        if result.passed:
            rows.append((d.name, kind, "fixed", what))
        else:
            again = "; ".join(f"{f.kind.value}{'' if same else ' (another finding)'}" for f, same in result.found)
            rows.append((d.name, kind, "still fails", f"{what}: {again}"))
    failing = sum(1 for r in rows if r[2] == "still fails")
    broken = sum(1 for r in rows if r[2] == "not run")
    if not args.quiet:
        width = max(len(r[0]) for r in rows)
        print(f"{'bundle':<{width}}  {'kind':<22}  {'result':<11}  details")
        for name, kind, status, details in rows:
            print(f"{name:<{width}}  {kind:<22}  {status:<11}  {details}")
        print(
            f"mlafuzz replay: {plural(len(rows), 'bundle')}: {failing} still failing, {len(rows) - failing - broken} fixed"
            + (f", {broken} not run" if broken else "")
        )
    if failing:
        return EXIT_FINDINGS
    return EXIT_USAGE if broken else EXIT_OK

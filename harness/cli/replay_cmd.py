"""``mlafuzz replay BUNDLE``: run a repro bundle's case again.

Exit 1 while the bundle's case still draws a finding (the original or another),
0 once it passes, 2 when the bundle is malformed or was tampered with (its
inputs.pt no longer matches what its spec and seed generate), or names an
external implementation that the command line did not (drive/replay.py says
why a bundle is never trusted to name code).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mlafuzz.harness.cli.args import EXIT_FINDINGS, EXIT_OK, UsageError, positive_seconds
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
    r.add_argument("bundle", help="bundle directory (OUT/bundles/...)")
    r.add_argument(
        "--impl",
        metavar="OP=REF",
        help="replay against this implementation (e.g. the fix), instead of the bundle's; needed for a "
        "bundle that names an external module:attr or path.py:attr",
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
    """The device a replay runs on when --device is not given: the bundle's, if this machine has it."""
    from mlafuzz.harness.drive.environment import cuda_available
    from mlafuzz.reports.bundle import read_case_json

    try:
        recorded = str(read_case_json(Path(args.bundle)).get("device", "cpu"))
    except Exception:  # a malformed bundle: the replay itself says so
        recorded = "cpu"
    return "cuda" if recorded.startswith("cuda") and cuda_available() else "cpu"


def cmd_replay(args: argparse.Namespace) -> int:
    from mlafuzz.harness.drive.replay import replay
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.kernels.entry import ImplError
    from mlafuzz.kernels.registry import parse_impl_arg
    from mlafuzz.reports import console
    from mlafuzz.reports.bundle import read_bundle

    table = table_from_ref(DEFAULT_TABLE)
    impl_ref = None
    if args.impl:
        op, impl_ref = parse_impl_arg(args.impl, ops=table.names)
        bundle_op = read_bundle(Path(args.bundle)).op
        if op != bundle_op:
            raise ImplError(f"--impl {args.impl}: this bundle is for op {bundle_op!r}")
    try:
        result = replay(
            bundle_path=Path(args.bundle),
            impl_ref=impl_ref,
            device=args.device,
            table=table,
            revision=args.revision,
            timeout=args.timeout,
            trust_bundle=args.trust_bundle,
        )
    except OSError as exc:
        raise UsageError(f"mlafuzz replay: {args.bundle}: {exc.strerror or exc}") from None
    if not args.quiet:
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

"""The ``mlafuzz`` command line.

Exit codes: 0 nothing found, 1 findings, 2 a usage or environment error (one
line on stderr, never a traceback), 130 interrupted, 143 stopped by SIGTERM.
Option values that start with '-' reach their option's own check
(``join_dash_values``). Nothing heavy is imported
until a command runs, so ``--help`` answers at once; a command that runs cases
first settles the environment (``TRITON_INTERPRET``) for its device, before
anything imports triton.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from mlafuzz.harness.cli import bench_cmd, fuzz_cmd, mutants_cmd, replay_cmd, report_cmd, warmup_cmd
from mlafuzz.harness.cli.args import EXIT_OK, EXIT_USAGE, Parser, UsageError
from mlafuzz.harness.ops.names import NAMES

VERSION = "0.1.0"


def cmd_list(args: argparse.Namespace) -> int:
    from mlafuzz.harness.drive.workers import DEFAULT_TABLE, table_from_ref
    from mlafuzz.kernels.registry import default_registry

    table = table_from_ref(DEFAULT_TABLE)
    registry = default_registry()
    for op in table.names:
        print(op)
        for e in registry.entries(op=op):
            tag = f" [mutant, expects {e.expected_kind}]" if e.is_mutant else ""
            if e.revision:  # judged under this contract revision whatever --revision says
                tag += f" [revision {e.revision}]"
            missing = e.missing()
            need = f" (needs {', '.join(missing)}: not installed)" if missing else ""
            print(f"  {e.name:<28} devices={','.join(sorted(e.devices)):<9} {e.description}{tag}{need}")
        if table.get(op).vllm:
            print(f"  {'vllm':<28} devices=cuda      vLLM's own, from an installed vllm")
    print("external: --impl OP=package.module:attr or --impl OP=path/to/file.py:attr")
    return EXIT_OK


def build_parser(*, names: tuple[str, ...] = NAMES) -> argparse.ArgumentParser:
    p = Parser(
        prog="mlafuzz",
        description="Differential fuzzer for sparse-MLA fp8_ds_mla KV-cache kernels: random "
        "decode/prefill batches through the implementation under test and exact PyTorch oracles.",
    )
    p.add_argument("--version", action="version", version=f"mlafuzz {VERSION}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    fuzz_cmd.add_parser(sub, names=names)
    replay_cmd.add_parser(sub, names=names)
    bench_cmd.add_parser(sub, names=names)
    mutants_cmd.add_parser(sub, names=names)
    warmup_cmd.add_parser(sub, names=names)
    ls = sub.add_parser(
        "list",
        help="show ops and registered implementations",
        description="Show every op and its registered implementations (and what they need).",
    )
    ls.set_defaults(func=cmd_list)
    report_cmd.add_parsers(sub)
    return p


def _prepare_environment(args: argparse.Namespace) -> None:
    """The device of a command that runs cases, and the environment it needs, before any kernel
    module is imported."""
    if not hasattr(args, "device"):
        return
    from mlafuzz.harness.drive.environment import default_device, prepare

    if args.device is None:
        device_from = getattr(args, "device_from", None)
        args.device = device_from(args) if device_from is not None else default_device()
    prepare(args.device)


def _options(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(every option string of the parser and its subcommands, those that take one value)."""
    every: set[str] = set()
    valued: set[str] = set()
    for action in parser._actions:  # argparse keeps its actions there; it has no public view of them
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                e, v = _options(sub)
                every |= e
                valued |= v
        elif action.option_strings:
            every.update(action.option_strings)
            if action.nargs is None:
                valued.update(action.option_strings)
    return every, valued


def join_dash_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``--shard -1/2`` as ``--shard=-1/2``: argparse takes a value that starts with '-' (and is not
    a negative number) for an option and says 'expected one argument'; joined, the value reaches
    the option's own type, whose one line says what is wrong with it."""
    every, valued = _options(parser)
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            out += args[i:]
            break
        nxt = args[i + 1] if i + 1 < len(args) else None
        if tok in valued and nxt is not None and nxt.startswith("-") and nxt != "-" and nxt.split("=")[0] not in every:
            out.append(f"{tok}={nxt}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    # The command's start, for a budget and the "first case done" line: the torch import and CUDA
    # check below (_prepare_environment, 2-4 s on a GPU machine) count against a budget, as a
    # user's clock counts them.
    started = time.monotonic()
    parser = build_parser()
    try:
        args = parser.parse_args(join_dash_values(parser, sys.argv[1:] if argv is None else argv))
        args.started = started
        early = getattr(args, "workers_early", None)
        if early is not None and early(args):  # the workers' server imports torch beside this process
            from mlafuzz.harness.drive.workers.context import StartMethodError, start_early

            try:
                start_early()
            except StartMethodError as exc:
                raise UsageError(f"mlafuzz: {exc}") from None
        from mlafuzz.harness.drive.environment import EnvironmentProblem

        try:
            _prepare_environment(args)
        except EnvironmentProblem as exc:
            raise UsageError(f"mlafuzz: {exc}") from None
        return args.func(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `mlafuzz list | head`: the reader left; nothing more to say
        sys.stderr.close()
        return EXIT_OK
    except Exception as exc:
        from mlafuzz.generators.spec import SpecError
        from mlafuzz.harness.drive.campaign import CampaignError
        from mlafuzz.harness.drive.workers import WorkerStartError
        from mlafuzz.kernels.entry import ImplError
        from mlafuzz.reports.bundle import BundleError

        if isinstance(exc, (CampaignError, ImplError, SpecError, BundleError, WorkerStartError)):
            print(f"mlafuzz: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())

"""``python -m mlafuzz.kernels.vllm_release --wheel W --root DIR --version V``: build DIR/vllm
from wheel W (``tree.build_tree``) and print DIR, the folder to put on PYTHONPATH."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlafuzz.kernels.vllm_release.tree import TreeError, build_tree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlafuzz.kernels.vllm_release", description=__doc__)
    p.add_argument("--wheel", required=True, type=Path, help="a vllm wheel (pip download --no-deps vllm==V)")
    p.add_argument("--root", required=True, type=Path, help="the folder to build (replaced when present)")
    p.add_argument("--version", required=True, help="the release's version, written as vllm.__version__")
    args = p.parse_args(argv)
    try:
        print(build_tree(wheel=args.wheel, root=args.root, version=args.version))
    except TreeError as exc:
        print(f"mlafuzz: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Argument parsing shared by the subcommands: one-line errors, value types checked at parse time.

Nothing here imports torch: ``mlafuzz --help`` answers at once.
"""

from __future__ import annotations

import argparse

from mlafuzz.harness.drive.campaign import ShardError, parse_shard, shard_from_env

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # Ctrl-C; SIGTERM (what CI sends on cancel)


class UsageError(Exception):
    """A user mistake: reported as one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage dump
        raise UsageError(f"{self.prog}: {message} (see --help)")


def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_seconds(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def nonneg_seconds(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _checked(fn, *args):
    try:
        return fn(*args)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shard(text: str) -> tuple[int, int]:
    """'K/N' with 0 <= K < N, as (K, N); 'auto': the CI's own split (``shard_from_env``)."""
    if text == "auto":
        return _checked(shard_from_env)[:2]
    return _checked(parse_shard, text)

"""A CI job's shard of the case space, from the variables its CI sets (``--shard auto``, the
pytest plugin). Nothing heavy is imported: ``mlafuzz --help`` answers at once.

Buildkite's ``parallelism: N`` step runs N copies with BUILDKITE_PARALLEL_JOB (0-based) and
BUILDKITE_PARALLEL_JOB_COUNT; a GitHub Actions matrix (or any CI) sets MLAFUZZ_SHARD=K/N itself.
"""

from __future__ import annotations

import os
from typing import Mapping

# CI systems that split one job into N parallel copies: (index variable, count variable).
CI_SHARD_VARIABLES = (("BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT"),)
SHARD_VARIABLE = "MLAFUZZ_SHARD"  # generic K/N (a GitHub Actions matrix sets it per job)


class ShardError(ValueError):
    """A malformed K/N (from the command line or a variable): one line."""


def parse_shard(text: str, *, what: str = "") -> tuple[int, int]:
    """'K/N' with 0 <= K < N, as (K, N); ``what`` names where it came from in the error."""
    k, sep, n = text.partition("/")
    try:
        index, count = int(k), int(n)
    except ValueError:
        index = count = -1
    if not sep or not (count >= 1 and 0 <= index < count):
        raise ShardError(f"expected K/N with 0 <= K < N, got {what}{text!r}")
    return index, count


def shard_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """(K, N, the variable it came from): MLAFUZZ_SHARD=K/N first (the user's own word), then
    Buildkite's pair, else (0, 1, ''). A malformed value raises ShardError naming the variable: a
    CI copy must not silently fuzz the wrong slice."""
    env = os.environ if environ is None else environ
    text = env.get(SHARD_VARIABLE, "").strip()
    if text:
        k, n = parse_shard(text, what=f"{SHARD_VARIABLE}=")
        return k, n, SHARD_VARIABLE
    for index_var, count_var in CI_SHARD_VARIABLES:
        index, count = env.get(index_var, "").strip(), env.get(count_var, "").strip()
        if index or count:
            k, n = parse_shard(f"{index or '?'}/{count or '?'}", what=f"{index_var}/{count_var}=")
            return k, n, index_var
    return 0, 1, ""

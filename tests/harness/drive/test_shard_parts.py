"""The plugin's items under xdist split a shard into parts: part k runs its share of the shard's
first N cases, and the parts together run exactly those N, none twice (whatever the mix's round
size, the part count and the CI job's shard)."""

from __future__ import annotations

import itertools

import pytest

from mlafuzz.harness.drive.fuzz import Shard


def _first(shard: Shard, n: int, size: int) -> list[int]:
    return list(itertools.islice((i for i in itertools.count() if shard.owns(i, size=size)), n))


@pytest.mark.parametrize("ci", [(0, 1), (1, 3)])
@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("parts", [1, 2, 5])
def test_the_parts_of_a_shard_run_exactly_its_first_n_cases(ci, size, parts):
    shard = Shard(index=ci[0], count=ci[1])
    for n in (0, 1, 2, size, 20, 41):
        runs = [
            _first(shard.part(k, parts), Shard.part_cases(n, size=size, k=k, parts=parts), size) for k in range(parts)
        ]
        ran = sorted(i for run in runs for i in run)
        assert ran == _first(shard, n, size), (n, runs)

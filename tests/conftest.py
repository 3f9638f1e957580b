"""Test-wide set-up: Triton interpreter on CPU, the `gpu` mark, Hypothesis profiles."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when a kernel is decorated: before any kernel module import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A plain `mlafuzz fuzz` draws a fresh seed; the suite's runs stay on fixed cases (seed 0) unless a
# test says otherwise (tests/harness/cli/test_seed_and_corpus.py takes it away to see fresh ones).
os.environ.setdefault("MLAFUZZ_SEED", "0")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
# CI: derandomized so a red run replays exactly, same example budget.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "default"))

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu mark); run on the H200")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

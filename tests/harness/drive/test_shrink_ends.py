"""Shrinking ends: on a case that always fails, every op's shrinker reaches a case it cannot make
smaller, each step taking the case strictly down the shrink order (generators/reduce.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlafuzz.generators.draw import KNOB_PRESETS
from mlafuzz.generators.reduce import shrink_key
from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.drive.shrink import shrink
from mlafuzz.harness.drive.tasks import Task, TaskResult
from mlafuzz.harness.ops.table import OPS
from mlafuzz.reports.findings import Finding, Kind


@pytest.mark.parametrize("op", OPS.names)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), size=st.sampled_from(sorted(KNOB_PRESETS)))
def test_every_ops_shrinker_ends_on_a_case_that_always_fails(op, seed, size):
    spec = OPS.draw_spec(op, seed=seed, knobs=KNOB_PRESETS[size])
    task = Task(index=0, op=op, seed=seed, impl_ref="planted", device="cpu", spec=spec_to_dict(spec))
    finding = Finding(kind=Kind.VALUE_MISMATCH, op=op, impl="planted", case_id="c", cause="always", message="m")
    accepted_keys = [shrink_key(spec)]

    def always_fails(trial: Task, deadline: float) -> TaskResult:
        return TaskResult(findings=(finding,))

    def step(attempts: int, accepted: int, spec_dict: dict) -> None:
        if accepted == len(accepted_keys):  # this attempt was taken
            accepted_keys.append(shrink_key(OPS.decode(spec_dict)))

    # The budget is a backstop only: with an instant evaluate an ending shrink takes milliseconds.
    result = shrink(task=task, finding=finding, evaluate=always_fails, budget=60.0, table=OPS, on_step=step)
    assert result.complete, f"{op}: the shrink did not end ({result.attempts} attempts, {result.accepted} taken)"
    assert all(b < a for a, b in zip(accepted_keys, accepted_keys[1:]))  # strictly down the order
    # Every reduction takes at least one unit of size or one option off: a bound on the steps taken.
    assert result.accepted <= sum(accepted_keys[0])
    assert result.accepted == len(accepted_keys) - 1

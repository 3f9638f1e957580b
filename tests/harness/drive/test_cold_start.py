"""A cold start: cases of ops whose kernels still build wait, the others start at once."""

from __future__ import annotations

import threading

from mlafuzz.harness.drive.campaign import built_or_not_needed
from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.kernels.registry import default_registry


class Recording(InProcess):
    def __init__(self) -> None:
        super().__init__()
        self.order: list[tuple[int, str]] = []

    def submit(self, task) -> None:
        self.order.append((task.index, task.op))
        super().submit(task)


def _config(tmp_path, **kw) -> FuzzConfig:
    return FuzzConfig(
        ops=("writer", "gather"),
        impls={"writer": "torch", "gather": "torch"},
        device="cpu",
        out_dir=tmp_path,
        contract_every=0,
        rerun_every=0,
        shares={"writer": 1, "gather": 1},  # alternating, so the order below is easy to read
        **kw,
    )


def test_a_budget_run_starts_the_ready_ops_and_runs_the_waiting_ops_cases_later_in_order(tmp_path):
    executor = Recording()

    def building(op: str) -> bool:  # the gather's "build" ends after 3 cases
        return op != "gather" or len(executor.order) >= 3

    summary = fuzz(
        _config(tmp_path, budget=600.0),
        executor=executor,
        ready=building,
        stop_when=lambda s: s.cases >= 8,
    )
    assert summary.cases == 8
    assert executor.order[:3] == [(0, "writer"), (2, "writer"), (4, "writer")]
    gathers = [i for i, op in executor.order if op == "gather"]
    assert gathers[:3] == [1, 3, 5]  # the waiting cases first, in their order
    assert summary.next_case >= 7


def test_a_cases_run_keeps_its_case_set_and_order_and_hands_out_nothing_while_an_op_builds(tmp_path):
    executor = Recording()
    polls = []

    def building(op: str) -> bool:  # the gather's "build" ends at the loop's fifth look
        polls.append(op)
        return op != "gather" or len(polls) > 8

    seen_at_submit: list[bool] = []
    submit = executor.submit
    executor.submit = lambda task: (seen_at_submit.append(len(polls) > 8), submit(task))
    fuzz(_config(tmp_path, cases=6), executor=executor, ready=building)
    assert [i for i, _ in executor.order] == [0, 1, 2, 3, 4, 5]
    # No worker was handed a case it would block on (each printing that it waits on the build).
    assert seen_at_submit and all(seen_at_submit)


def test_an_op_waits_only_while_the_build_thread_runs_and_only_if_it_needs_the_extension():
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    registry = default_registry()  # whether an entry needs the extension is its own fact
    chosen = {"convert": "triton", "gather": "cuda", "step": "ours"}
    ready = built_or_not_needed(thread, {op: registry.get(op, name) for op, name in chosen.items()})
    assert ready("convert") and not ready("gather") and not ready("step")
    release.set()
    thread.join()
    assert ready("gather") and ready("step")

"""The op mix: each op takes its share of every round of a run's cases, interleaved, and case i's
op, error input and re-run stay pure functions of (seed, i) through resumes and shards."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from mlafuzz.harness.check.session import Session
from mlafuzz.harness.drive.fuzz import FuzzConfig, Shard, fuzz
from mlafuzz.harness.drive.mix import Mix
from mlafuzz.harness.drive.resume import ResumeError, load_resume
from mlafuzz.harness.drive.workers import InProcess
from mlafuzz.harness.ops.table import OPS

# Shares fixed here where a test's arithmetic reads them (the op table's are tuned to the H200).
FIXED = {
    "convert": 6,
    "gather": 6,
    "writer": 8,
    "step": 1,
    "plan": 16,
    "dcp": 4,
    "dcp_peer": 2,
    "nvfp4_gather": 6,
    "nvfp4_writer": 5,
}


def _config(ops: tuple[str, ...] = OPS.names, **kw) -> FuzzConfig:
    return FuzzConfig(ops=ops, impls=dict.fromkeys(ops, "torch"), cases=kw.pop("cases", 1), **kw)


def test_every_round_gives_each_op_its_share_interleaved_not_in_blocks():
    config = _config()
    mix = config.mix
    shares = {op.name: op.share for op in OPS.ops}
    assert mix.to_json() == shares and mix.size == sum(shares.values())
    for start in (0, 5 * mix.size):
        ops = [config.task(i).op for i in range(start, start + mix.size)]
        assert collections.Counter(ops) == shares
    longest = max(len(list(run)) for run in _runs(mix.op(i) for i in range(mix.size)))
    assert longest <= 2  # the heaviest share is spread through the round, not one block of 16
    # A run of as many cases as there are ops already fuzzes every op, the smallest share included.
    assert [mix.op(i) for i in range(len(OPS.names))] == list(OPS.names)


def _runs(seq):
    last, run = object(), []
    for x in seq:
        if x != last and run:
            yield run
            run = []
        run.append(x)
        last = x
    if run:
        yield run


def test_a_cases_run_gives_each_op_about_its_share_of_n():
    config = _config()
    n = 3 * config.mix.size + 10
    counts = collections.Counter(config.task(i).op for i in range(n))
    total = sum(op.share for op in OPS.ops)
    for op in OPS.ops:
        assert abs(counts[op.name] - n * op.share / total) <= op.share, (op.name, counts)


def test_one_op_or_equal_shares_number_cases_as_before_shares():
    one = _config(("plan",))
    assert one.mix.size == 1 and [one.mix.own(i) for i in range(5)] == [0, 1, 2, 3, 4]
    ops = ("convert", "gather", "step")
    equal = _config(ops, shares=dict.fromkeys(ops, 5))  # reduced by their gcd: one case per op
    for i in range(30):
        assert equal.mix.op(i) == ops[i % 3] and equal.mix.own(i) == i // 3  # the old numbering


def test_each_op_gets_error_inputs_and_reruns_at_its_own_rate_whatever_its_share():
    config = _config(contract_every=3, rerun_every=4, shares=FIXED)
    tasks = [config.task(i) for i in range(12 * config.mix.size)]  # 12 rounds: divisible by 3 and 4
    for op in OPS.ops:
        mine = [t for t in tasks if t.op == op.name]
        assert len(mine) == 12 * FIXED[op.name]
        assert sum(t.rerun for t in mine) == len(mine) // 4, op.name
        contracts = sum(t.contract is not None for t in mine)
        assert contracts == (len(mine) // 3 if op.invalid else 0), op.name
    size = config.mix.size
    for start in range(0, len(tasks), size):  # and spread over the run: in every round, not every 4th
        one = collections.Counter((t.op, t.rerun) for t in tasks[start : start + size])
        assert one[("plan", True)] == 4 and one[("writer", True)] == 2  # shares 16 and 8


def test_shards_own_whole_rounds_and_together_are_the_run():
    config = _config()
    size = config.mix.size
    shards = [Shard(index=k, count=3) for k in range(3)]
    owned = [{i for i in range(9 * size) if s.owns(i, size=size)} for s in shards]
    assert sum(len(o) for o in owned) == 9 * size and set().union(*owned) == set(range(9 * size))
    for o in owned:  # three rounds each: every op its share three times
        assert collections.Counter(config.task(i).op for i in o) == {k: 3 * v for k, v in config.mix.to_json().items()}


class Recording(InProcess):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.tasks: list = []

    def submit(self, task) -> None:
        self.tasks.append(task)
        super().submit(task)


def test_a_resumed_run_goes_on_with_the_same_sequence_of_ops(tmp_path):
    session = Session(table=OPS)
    ops = ("plan", "writer")  # shares 16 and 8: two plan cases to each writer one

    def config(out: Path, cases: int) -> FuzzConfig:
        return FuzzConfig(
            ops=ops,
            impls={"plan": "ours", "writer": "torch"},
            device="cpu",
            cases=cases,
            seed=5,
            out_dir=out,
            shares={"plan": 16, "writer": 8},
        )

    first_part = Recording(session=session)
    fuzz(config(tmp_path / "parts", 7), executor=first_part)
    resume = load_resume(tmp_path / "parts", config(tmp_path / "parts", 8).run_json())
    second_part = Recording(session=session)
    fuzz(config(tmp_path / "parts", 8), executor=second_part, resume=resume)
    whole = Recording(session=session)
    fuzz(config(tmp_path / "whole", 15), executor=whole)
    assert first_part.tasks + second_part.tasks == whole.tasks
    assert [t.op for t in whole.tasks] == [config(tmp_path, 1).mix.op(i) for i in range(15)]
    assert json.loads((tmp_path / "parts" / "run.json").read_text())["shares"] == {"plan": 2, "writer": 1}


def _old_run(out: Path, config: FuzzConfig) -> None:
    """A run folder as an mlafuzz before shares wrote it."""
    out.mkdir()
    run = config.run_json()
    del run["shares"]
    (out / "run.json").write_text(json.dumps(run))
    (out / "summary.json").write_text(json.dumps({"cases": 3, "next_case": 3}))


def test_a_run_from_before_shares_resumes_where_its_mix_is_unchanged_and_is_refused_where_not(tmp_path):
    alone = _config(("gather",), out_dir=tmp_path / "alone")
    _old_run(alone.out_dir, alone)
    assert load_resume(alone.out_dir, alone.run_json()).next_case == 3
    ops = ("convert", "writer")
    mixed = _config(ops, out_dir=tmp_path / "mixed", shares=FIXED)
    _old_run(mixed.out_dir, mixed)
    with pytest.raises(ResumeError) as refused:
        load_resume(mixed.out_dir, mixed.run_json())
    message = str(refused.value)
    assert "older mlafuzz" in message and "convert 3, writer 4" in message and "\n" not in message
    equal = _config(ops, out_dir=mixed.out_dir, shares=dict.fromkeys(ops, 2))
    assert load_resume(equal.out_dir, equal.run_json()).next_case == 3
    with pytest.raises(ResumeError, match="its ops is"):  # another run is told as such, shares or not
        load_resume(mixed.out_dir, _config(("convert", "gather")).run_json())


def test_a_run_resumed_by_an_mlafuzz_with_other_shares_is_refused_saying_so(tmp_path):
    ops = ("convert", "writer")
    made = _config(ops, out_dir=tmp_path, shares={"convert": 1, "writer": 2})
    fuzz_dir = made.out_dir
    (fuzz_dir / "run.json").write_text(json.dumps(made.run_json()))
    (fuzz_dir / "summary.json").write_text(json.dumps({"cases": 3, "next_case": 3}))
    with pytest.raises(ResumeError, match=r"another mlafuzz; .*\(convert 3, writer 4, not convert 1, writer 2\)"):
        load_resume(fuzz_dir, _config(ops, out_dir=tmp_path, shares=FIXED).run_json())


def test_a_share_that_is_not_a_whole_number_above_zero_is_refused():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="share="):
            _config(("plan", "writer"), shares={"plan": bad})
    with pytest.raises(ValueError, match="pair up"):
        Mix(ops=("plan",), shares=(1, 2))

"""A task's spec is resolved once and carried; the task itself stays small on the wire."""

from __future__ import annotations

import pickle

from mlafuzz.generators.spec import spec_to_dict
from mlafuzz.harness.drive.tasks import Task
from mlafuzz.harness.ops.names import NEWEST_REVISION
from mlafuzz.harness.ops.op import OpTable
from mlafuzz.tests.support.helpers import OPS


class _Counting(OpTable):
    """The op table, counting the specs it draws."""

    def draw_spec(self, op, *, seed, knobs):
        self.drawn.append((op, seed))
        return super().draw_spec(op, seed=seed, knobs=knobs)


def test_one_draw_gives_a_task_its_spec_its_case_id_and_its_written_out_form():
    table = _Counting(OPS.ops)
    object.__setattr__(table, "drawn", [])
    task = Task(index=0, op="gather", seed=11, impl_ref="torch", device="cpu")
    r = task.resolve(table)
    assert (r.case_id, r.described.spec, r.spec_dict) == (r.case_id, spec_to_dict(r.spec), spec_to_dict(r.spec))
    assert table.drawn == [("gather", 11)]
    assert r.case_id == task.case_id(OPS) and r.described == task.with_spec(OPS)
    finding = r.context(revision=NEWEST_REVISION).finding(None, "crash", message="lost")
    assert (finding.case_id, finding.seed, finding.spec, finding.revision) == (
        r.case_id,
        11,
        r.spec_dict,
        NEWEST_REVISION,
    )


def test_a_task_crosses_to_a_worker_without_its_spec():
    task = Task(index=0, op="writer", seed=3, impl_ref="torch", device="cpu")
    task.resolve(OPS)
    assert pickle.loads(pickle.dumps(task)) == task and task.spec is None
    given = task.resolve(OPS).described
    assert given.resolve(OPS).case_id == task.resolve(OPS).case_id

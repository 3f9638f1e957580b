"""In-place outputs of a cache at the top of a larger one: compare what a call may write, check the
rest stayed zero, and hold one huge copy at a time.

A case whose cache sits high in a huge one (``Case.zero_blocks``: a 4 GB cache
of which only the last blocks are the case's) would cost the full path three
or four copies of the whole cache for an in-place op (the call's, the
re-run's, the oracle's, the comparator's masks). Instead, right after each
call: the bytes it wrote into the zero blocks are counted (they must stay
zero: no valid slot maps there), and its output is replaced by a copy of the
blocks past them, dropping the full copy. The op's oracle returns the same
blocks (``Op.oracle``), and the comparator reports indices in the full
cache (``compare(origin=...)``).
"""

from __future__ import annotations

import dataclasses

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.check.calls import Call
from mlafuzz.harness.check.compare import Context
from mlafuzz.harness.memory.bits import nonzero_bytes
from mlafuzz.harness.ops.op import Op
from mlafuzz.reports.findings import Finding, Mismatch


def narrowed_names(op: Op, case: Case) -> dict[str, int]:
    """In-place outputs compared from a row on: name -> its zero blocks."""
    return {k: n for k, n in case.zero_blocks.items() if k in op.inplace and n}


def _head_finding(name: str, head: torch.Tensor, written: int, ctx: Context) -> Finding:
    flat = head.reshape(-1)
    first = int(torch.nonzero(flat)[0])
    where: list[int] = []
    for dim in reversed(head.shape):
        where.append(first % dim)
        first //= dim
    where.reverse()
    return ctx.finding(
        name,
        "zero_blocks",
        count=written,
        total=flat.numel(),
        mismatches=(Mismatch(index=tuple(where), expected="0", actual=str(int(head[tuple(where)]))),),
        message=f"{name}: Mismatched elements: {written} bytes written in blocks [0, {head.shape[0]}),"
        f" which no slot maps to (they hold zeros); first at {where}",
    )


def narrow(op: Op, case: Case, call: Call, ctx: Context) -> tuple[Call, list[Finding]]:
    """``call`` with each in-place output that has zero blocks replaced (in its outputs and inputs) by
    a copy of the blocks past them, and a VALUE_MISMATCH for any byte it wrote into them."""
    names = narrowed_names(op, case)
    outputs = dict(call.outputs or {})
    names = {k: n for k, n in names.items() if isinstance(outputs.get(k), torch.Tensor)}
    if not names:
        return call, []
    inputs = dict(call.inputs)
    findings = []
    for name, n in names.items():
        full = outputs[name]
        head = full[:n]
        written = nonzero_bytes(head)
        if written:
            findings.append(
                _head_finding(name, head.view(torch.uint8) if head.element_size() == 1 else head, written, ctx)
            )
        tail = full[n:].clone()
        outputs[name] = tail
        if inputs.get(name) is full:
            inputs[name] = tail
    return dataclasses.replace(call, outputs=outputs, inputs=inputs), findings

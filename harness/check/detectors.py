"""Findings of one call beyond its outputs' values: red zones, input bytes, a re-run, pending errors."""

from __future__ import annotations

from typing import Any, Collection, Iterator, Mapping

import torch

from mlafuzz.generators.case import Case
from mlafuzz.harness.check.calls import Call
from mlafuzz.harness.memory.bits import (
    TOGETHER_BYTES,
    as_bits,
    differ_flag,
    differ_flag_any,
    differing,
    nonzero_bytes,
    read_flags,
    same_bits,
    word_view,
)
from mlafuzz.reports.findings import Context, Finding, Kind


def redzone_findings(call: Call, ctx: Context) -> list[Finding]:
    """OOB_WRITE for red-zone canaries the call changed, named by the tensor they guard."""
    names = {}
    for name, t in {**call.inputs, **(call.outputs or {})}.items():
        if isinstance(t, torch.Tensor) and t.is_cuda:
            names[t.data_ptr()] = name
    out = []
    for v in call.redzone:
        name = names.get(v.ptr, f"an allocation of {v.size} bytes")
        out.append(
            ctx.finding(
                names.get(v.ptr),
                f"oob_{v.side}" if v.ptr in names else f"alloc:oob_{v.side}",
                kind=Kind.OOB_WRITE,
                count=v.count,
                message=f"{name}: {v.count} bytes written {v.side} it (nearest {v.offset} bytes "
                f"{'before its start' if v.side == 'before' else 'past its end'}; "
                f"red-zone allocator)",
            )
        )
    return out


def launch_error_findings(call: Call, ctx: Context) -> list[Finding]:
    """LAUNCH_ERROR: the call returned (or raised) with a CUDA error left pending."""
    if call.launch_error is None:
        return []
    return [
        ctx.finding(
            None,
            "pending_cuda_error",
            kind=Kind.LAUNCH_ERROR,
            message=f"the call left a CUDA error pending ({call.launch_error}): a launch it did not check;"
            " the next CUDA call anywhere in the process would have raised it",
        )
    ]


def _changed(before: torch.Tensor, after: torch.Tensor, zero_blocks: int) -> int:
    """Elements of ``after`` that differ from ``before`` (0: the same bits). A tensor with zero
    blocks (Case.zero_blocks) is compared past them, and its zero blocks counted where not zero:
    one read of a huge cache instead of two."""
    if zero_blocks and after.shape == before.shape and after.dtype == before.dtype:
        tail = (
            0
            if same_bits(before[zero_blocks:], after[zero_blocks:])
            else int((as_bits(before[zero_blocks:]) != as_bits(after[zero_blocks:])).sum())
        )
        return tail + nonzero_bytes(after[:zero_blocks])
    if same_bits(before, after):
        return 0
    return int((as_bits(before) != as_bits(after)).sum())


def _suspects(case: Case, inputs: Mapping[str, Any], *, inplace: frozenset[str]) -> list[str]:
    """The inputs that may have changed, all decided in one host sync (a sync per input stops a
    run scaling with workers: issue 29): bytes that differ from the case's, or past a tensor's
    zero blocks, and zero blocks holding a set byte; small inputs side by side, one flag per device
    for all of them (``differ_flag_any``: all are suspects when it is set). ``_changed`` then counts
    each suspect, so a suspect that did not change makes no finding."""
    names, flags = [], []
    together: dict[torch.device, list[str]] = {}  # small inputs: one flag per device, all suspects if set
    for name, before in case.tensors.items():
        after = inputs.get(name)
        if before is None or after is None or name in inplace:
            continue
        zero_blocks = case.zero_blocks.get(name, 0)
        alike = after.shape == before.shape and after.dtype == before.dtype and after.device == before.device
        if zero_blocks and alike:
            flags.append(differ_flag(before[zero_blocks:], after[zero_blocks:]) | word_view(after[:zero_blocks]).any())
        elif alike and before.numel() * before.element_size() <= TOGETHER_BYTES:
            together.setdefault(before.device, []).append(name)
            continue
        else:
            flags.append(differ_flag(before, after))
        names.append([name])
    for group in together.values():
        flags.append(differ_flag_any([(case.tensors[n], inputs[n]) for n in group]))
        names.append(group)
    suspects = {name for group, differs in zip(names, read_flags(flags)) if differs for name in group}
    return [name for name in case.tensors if name in suspects]


def input_mutations(case: Case, inputs: Mapping[str, Any], ctx: Context, *, inplace: frozenset[str]) -> list[Finding]:
    out = []
    for name in _suspects(case, inputs, inplace=inplace):
        before, after = case.tensors[name], inputs[name]
        changed = _changed(before, after, case.zero_blocks.get(name, 0))
        if changed:
            out.append(
                ctx.finding(
                    name,
                    "mutated",
                    kind=Kind.INPUT_MUTATION,
                    count=changed,
                    total=as_bits(before).numel(),
                    message=f"input {name} changed during the call ({changed} elements)",
                )
            )
    return out


def rerun_pairs(
    first: Call, second: Call, *, unordered: Collection[str] = ()
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, first run's, second run's) of each output the impl allocated, alike in shape and
    dtype: the ones whose bits a re-run is held to (guarded outputs answer to the write map).
    ``unordered``: outputs whose rows hold an unspecified order (the comparator's row-set mode):
    each row sorted, so two runs that agree as multisets agree here."""
    for name, a in (first.outputs or {}).items():
        b = (second.outputs or {}).get(name)
        if (
            name not in first.guards
            and isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
        ):
            if name in unordered and a.dim() == 2:
                a, b = a.sort(dim=1).values, b.sort(dim=1).values
            yield name, a, b


def rerun_differs(first: Call, second: Call, ctx: Context, *, unordered: Collection[str] = ()) -> list[Finding]:
    """Nondeterminism of outputs the impl allocated (guarded ones use the write map); outputs in
    ``unordered`` by row multisets (see ``rerun_pairs``)."""
    pairs = list(rerun_pairs(first, second, unordered=unordered))
    out = []
    for (name, a, b), differs in zip(pairs, differing([(a, b) for _, a, b in pairs])):  # one sync for all
        if differs:
            n = int((as_bits(a) != as_bits(b)).sum())
            out.append(
                ctx.finding(
                    name,
                    "rerun",
                    kind=Kind.NONDETERMINISM,
                    count=n,
                    total=as_bits(a).numel(),
                    message=f"{name}: a second run of the same case differs in {n} elements",
                )
            )
    return out

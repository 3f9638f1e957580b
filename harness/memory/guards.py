"""Guard zones around outputs the harness allocates, and the two-pattern write map.

An output (gather's ``dst``) is a view into the middle of a larger byte buffer.
When the output is itself a row slice of a larger workspace (SPEC 8: vLLM
passes ``workspace[:seq_tot]``), the workspace's other rows belong to the zones
too: the implementation may write only its view. The buffer is filled with
pattern A for the first run and pattern B for the second. After both runs:

- a guard byte that differs from its run's fill was written out of bounds
  (OOB_WRITE);
- an output byte still equal to A after run 1 *and* to B after run 2 was never
  written (MISSING_WRITE): a kernel cannot write the fill value in both runs;
- an output byte written in both runs with different values is NONDETERMINISM.

Works on any device, so CPU runs of the torch implementations are guarded too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from mlafuzz.harness.memory.bits import same_bits
from mlafuzz.reports.findings import Context, Finding, Kind, Mismatch

GUARD_BYTES = 4096  # a multiple of 16, so the output after the zone keeps 16-byte vector alignment
PATTERNS = (0xA5, 0x5A)  # bf16 0xA5A5 / 0x5A5A: normal finite numbers, unlike any sentinel NaN


@dataclass(frozen=True, kw_only=True)
class Guarded:
    """One guarded output: the full byte buffer and the view the impl receives."""

    full: torch.Tensor  # uint8 [start + nbytes + after]: the zones around the output's bytes
    view: torch.Tensor  # the output tensor handed to the implementation
    fill: int
    start: int = GUARD_BYTES  # where the output's bytes start: a guard zone, then workspace rows before it

    @property
    def nbytes(self) -> int:
        return self.view.numel() * self.view.element_size()

    def region(self) -> torch.Tensor:
        return self.full[self.start : self.start + self.nbytes]

    def zones(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The bytes before and after the output that it must not write (byte views): its guard
        zones, with the rows of the workspace it is a slice of."""
        return self.full[: self.start], self.full[self.start + self.nbytes :]


def guarded_empty(
    *,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    fill: int,
    rows_before: int = 0,
    rows_after: int = 0,
) -> Guarded:
    """A guarded output filled with ``fill``, its zones and its own bytes alike (the fast path's
    prefill then overwrites the output's: one fill of the whole buffer is one launch, its zones
    alone were two). ``rows_before`` / ``rows_after``: the output is rows of a workspace with that
    many more rows of its width before / after it (a row slice, SPEC 8): one tensor, whose other
    rows are zone bytes."""
    return guarded_set(
        shapes={"": shape}, dtype=dtype, device=device, fill=fill, rows_before=rows_before, rows_after=rows_after
    )[""]


def guarded_set(
    *,
    shapes: Mapping[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: str,
    fill: int,
    rows_before: int = 0,
    rows_after: int = 0,
) -> dict[str, Guarded]:
    """Guarded outputs of one call (as ``guarded_empty``, each with its own zones and workspace
    rows), one after another in one byte buffer made by one fill: a launch per call, not one per
    output. Each output's bytes start 16-byte aligned (its zone after it takes the padding)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    pieces = []
    total = 0
    for name, shape in shapes.items():
        row = itemsize * _numel(shape[1:])  # bytes per row of the output (and of its workspace)
        nbytes = row * shape[0] if shape else itemsize
        start, after = GUARD_BYTES + rows_before * row, GUARD_BYTES + rows_after * row
        size = start + nbytes + after
        size += -size % 16  # the next output's zone, and so its bytes, stay 16-byte aligned
        pieces.append((name, shape, row, total, start, nbytes, size))
        total += size
    buf = torch.full((total,), fill, dtype=torch.uint8, device=device)
    out = {}
    for name, shape, row, at, start, nbytes, size in pieces:
        full = buf[at : at + size]
        if rows_before or rows_after:  # the view is rows of the workspace between the guard zones
            rows = rows_before + shape[0] + rows_after
            workspace = full[GUARD_BYTES : GUARD_BYTES + rows * row]
            view = workspace.view(dtype).reshape((rows, *shape[1:]))[rows_before : rows_before + shape[0]]
        else:
            view = full[start : start + nbytes].view(dtype).reshape(shape)
        out[name] = Guarded(full=full, view=view, fill=fill, start=start)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _byte_to_element(byte_index: int, view: torch.Tensor) -> list[int]:
    flat = byte_index // view.element_size()
    idx = []
    for dim in reversed(view.shape):
        idx.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return list(reversed(idx))


def _bytes(n: int) -> str:
    return f"{n} byte" if n == 1 else f"{n} bytes"


def oob_findings(*, name: str, g: Guarded, ctx: Context) -> list[Finding]:
    zone_before, zone_after = g.zones()  # stay on their device: only counts and a few indices cross to the host
    before = zone_before != g.fill
    after = zone_after != g.fill
    counts = torch.stack((before.sum(), after.sum())).tolist()  # one sync, not two
    n_before, n_after = int(counts[0]), int(counts[1])
    if not (n_before or n_after):
        return []
    where = []
    if n_before:
        first = int(before.nonzero()[-1])  # closest to the output
        where.append(f"{_bytes(n_before)} before it (the nearest at byte -{g.start - first} from its start)")
    if n_after:
        first = int(after.nonzero()[0])
        where.append(f"{_bytes(n_after)} after it (the first at byte +{first} from its end)")
    side = "before" if n_before and not n_after else "after" if n_after and not n_before else "both"
    return [
        ctx.finding(
            name,
            f"oob_{side}",
            kind=Kind.OOB_WRITE,
            count=n_before + n_after,
            total=zone_before.numel() + zone_after.numel(),
            message=f"{name}: wrote outside the output: {' and '.join(where)}",
        )
    ]


def never_written(run_a: Guarded, run_b: Guarded, *, differ: bool | None = None) -> torch.Tensor | None:
    """Per element of the output (flat, bool): some byte of it was never written (it holds each
    run's fill); None when every byte was written. ``differ``: whether the two regions' bytes
    differ, where the caller read it already (with other checks, in one sync)."""
    a, b = run_a.region(), run_b.region()
    if not (not same_bits(a, b) if differ is None else differ):  # fills differ: equal runs wrote every byte
        return None
    missing = (a == run_a.fill) & (b == run_b.fill)
    per_element = missing.reshape(-1, run_a.view.element_size()).any(dim=1)
    return per_element if bool(per_element.any()) else None


def write_map_findings(
    *, name: str, run_a: Guarded, run_b: Guarded, ctx: Context, differ: bool | None = None
) -> list[Finding]:
    """MISSING_WRITE and NONDETERMINISM from the two runs' output regions (``differ``: as for
    ``never_written``)."""
    a, b = run_a.region(), run_b.region()
    differ = not same_bits(a, b) if differ is None else differ
    if not differ:  # one pass: fills differ, so equal runs wrote every byte, identically
        return []
    out: list[Finding] = []
    unwritten = never_written(run_a, run_b, differ=True)
    if unwritten is not None:
        elems = int(unwritten.sum())
        first = _byte_to_element(int(unwritten.nonzero()[0]) * run_a.view.element_size(), run_a.view)
        out.append(
            ctx.finding(
                name,
                "missing",
                kind=Kind.MISSING_WRITE,
                count=elems,
                total=run_a.view.numel(),
                mismatches=(Mismatch(index=tuple(first), expected="written", actual="untouched"),),
                message=f"{name}: {elems} / {run_a.view.numel()} elements never written, first at {first}"
                " (their values are not compared again)",
            )
        )
    written_both = (a != run_a.fill) & (b != run_b.fill)
    differ = written_both & (a != b)
    if unwritten is not None:
        # An element with a byte never written was not stored whole: its other bytes differing
        # between the runs is each run's fill showing through (a counter added into the
        # caller's buffer, SPEC 9.2), the MISSING_WRITE above, not a race.
        differ &= ~unwritten.repeat_interleave(run_a.view.element_size())
    nd = int(differ.sum())
    if nd:
        first = _byte_to_element(int(differ.nonzero()[0]), run_a.view)
        out.append(
            ctx.finding(
                name,
                "rerun",
                kind=Kind.NONDETERMINISM,
                count=nd,
                total=a.numel(),
                message=f"{name}: a second run of the same case differs in {nd} bytes, first at {first}",
            )
        )
    return out

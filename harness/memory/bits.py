"""Bit-for-bit views and equality of tensors, shared by the comparator, guards and runner."""

from __future__ import annotations

from typing import Sequence

import torch

# The oracles' one-sync host copy, shared: the harness's checks read metadata the same way.
from mlafuzz.oracles._seq import host_copies as host_copies


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """A flat view to compare bit for bit (floats as bytes, so NaN payloads and -0 count)."""
    return t.reshape(-1).contiguous().view(torch.uint8) if t.is_floating_point() else t.reshape(-1)


def word_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as 4-byte words, or bytes where its size or address does not allow
    that (a non-contiguous tensor: the bytes of a contiguous copy of it). Word-wise equality over
    a few hundred MB is several times faster than byte-wise; and one word width for (nearly)
    every tensor keeps the fingerprint launch (harness.fingerprint) to a few compiled variants:
    with 8- or 4-byte words chosen by size, fuzzing compiled twenty-odd variants of the gather
    inputs' launch (seconds each, in every worker). Each view costs a few us of host time: as
    few as the tensor allows."""
    flat = t if t.is_contiguous() else t.contiguous()
    n = flat.numel()
    # An empty tensor reports address 0 whatever its storage offset: wider views could refuse it.
    if n == 0 or (n * flat.element_size()) % 4 or flat.data_ptr() % 4:
        return flat.reshape(-1).view(torch.uint8)
    # Words in the tensor's own shape where torch allows it (one view op, or none): the
    # fingerprint reads numel() words from the address, whatever the shape.
    if flat.dtype == torch.int32:
        return flat
    if flat.dim() and (flat.shape[-1] * flat.element_size()) % 4 == 0:
        return flat.view(torch.int32)
    return flat.reshape(-1).view(torch.uint8).view(torch.int32)


def _alike(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a's and b's bytes as words of one width (b moved to a's device): bytes when their
    addresses allow different widths."""
    wa, wb = word_view(a), word_view(b.to(a.device))
    if wa.shape != wb.shape or wa.dtype != wb.dtype:  # word views keep their tensor's shape
        wa, wb = wa.reshape(-1), wb.reshape(-1)
    if wa.dtype != wb.dtype:
        return wa.view(torch.uint8), wb.view(torch.uint8)
    return wa, wb


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b hold the same bytes (same dtype size and element count assumed by the
    callers; a shape or dtype difference is theirs to report)."""
    if a.numel() * a.element_size() != b.numel() * b.element_size():
        return False
    return bool(torch.equal(*_alike(a, b)))


def differ_flag(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A device bool: a and b do not hold the same bytes (``same_bits``, without the host sync,
    for checks read together in one)."""
    if a.numel() * a.element_size() != b.numel() * b.element_size():
        return torch.ones((), dtype=torch.bool, device=a.device)
    wa, wb = _alike(a, b)
    return (wa != wb).any()


# Tensors of at most this many bytes are compared side by side (``differ_flag_any``): metadata,
# tables, counts. Larger ones are compared each in place (a copy of them would cost more).
TOGETHER_BYTES = 1 << 16


def differ_flag_any(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A device bool: some pair does not hold the same bytes. Each pair alike in shape and dtype,
    all on one device; their bytes are laid side by side and compared in one op, not one (and its
    ``any``) per pair: a case's dozen small tensors cost a few ops, not two dozen (issue 29)."""
    a = torch.cat([x.reshape(-1).contiguous().view(torch.uint8) for x, _ in pairs])
    b = torch.cat([y.reshape(-1).contiguous().view(torch.uint8) for _, y in pairs])
    return (a != b).any()


def read_flags(flags: Sequence[torch.Tensor]) -> list[bool]:
    """Device bools read to the host in one sync per device (not one per flag): with several
    worker processes on a GPU each sync waits for the others' turns, so a case's checks are
    decided together (issue 29). Flags already on the CPU cost no sync."""
    out: list[bool | None] = [None] * len(flags)
    by_device: dict[torch.device, list[int]] = {}
    for i, f in enumerate(flags):
        by_device.setdefault(f.device, []).append(i)
    for idx in by_device.values():
        values = torch.stack([flags[i].reshape(()) for i in idx]).tolist()
        for i, v in zip(idx, values):
            out[i] = bool(v)
    return [bool(v) for v in out]


def differing(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """Per pair, ``not same_bits(a, b)``, all read in one host sync (``read_flags``)."""
    return read_flags([differ_flag(a, b) for a, b in pairs])


def nonzero_bytes(t: torch.Tensor) -> int:
    """How many of t's bytes are not zero (one host sync). Word-wise first: a huge all-zero region
    (a cache's zero blocks) is read at word speed, and its bytes counted only when some are set."""
    flat = t if t.is_contiguous() else t.contiguous()
    words = word_view(flat)
    if not bool(words.any()):
        return 0
    return int(torch.count_nonzero(flat.reshape(-1).view(torch.uint8)))

"""Bit-for-bit views and equality of tensors, shared by the comparator, guards and runner."""

from __future__ import annotations

import torch


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """A flat view to compare bit for bit (floats as bytes, so NaN payloads and -0 count)."""
    return t.reshape(-1).contiguous().view(torch.uint8) if t.is_floating_point() else t.reshape(-1)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t, viewed as 8-byte words where the size and address allow (a byte-wise
    equality over a few hundred MB costs several times the kernel it checks)."""
    raw = t.reshape(-1).contiguous().view(torch.uint8)
    if raw.numel() % 8 == 0 and raw.data_ptr() % 8 == 0:
        return raw.view(torch.int64)
    return raw


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b hold the same bytes (same dtype size and element count assumed by the
    callers; a shape or dtype difference is theirs to report)."""
    if a.numel() * a.element_size() != b.numel() * b.element_size():
        return False
    return bool(torch.equal(_words(a), _words(b.to(a.device))))


def differ_flag(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A device bool: a and b do not hold the same bytes (``same_bits``, without the host sync,
    for checks read together in one)."""
    if a.numel() * a.element_size() != b.numel() * b.element_size():
        return torch.ones((), dtype=torch.bool, device=a.device)
    return (_words(a) != _words(b.to(a.device))).any()

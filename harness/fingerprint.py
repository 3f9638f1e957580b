"""Input fingerprints: "did the call change this input?" without a copy of it.

The GPU fast path (harness.runner) hands an implementation views of the case's
own input tensors instead of copies. Before the call it takes a fingerprint of
each large input (one read of it) and a byte copy of the small ones (one
``torch.cat``); after the call, the same again. Equal fingerprints say the
input is unchanged; a changed one sends the case to the full path, which copies
every input as before, after the case's tensors are rebuilt from its spec and
seed.

The fingerprint of a tensor's bytes, read as 8-byte words w_i (4- or 1-byte when
its size or address does not allow 8), is the wrapping 64-bit sum of
f(w_i, i) = xorshift32((w_i ^ (i * K1)) * K2), K1, K2 odd. For each i, f is a
bijection of w_i (xor with a constant, multiply by an odd constant and an xor
shift are each invertible mod 2^64), so a change to any single word always
changes the sum; changes to several words cancel only by a 2^-64 coincidence
of pseudo-random terms. Exact comparison stays with the full path, which runs
whenever the fingerprint moves.

One read of the bytes per fingerprint, no host synchronization: each launch
adds its sum into one int64 slot of a device vector.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
SMALL_BYTES = 1 << 20  # inputs below this are copied (one cat for all), not fingerprinted


@triton.jit
def _fingerprint(words_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(words_ptr + offs, mask=offs < n, other=0).to(tl.int64).to(tl.uint64, bitcast=True)
    idx = offs.to(tl.uint64, bitcast=True)
    x = (w ^ (idx * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 32)
    x = tl.where(offs < n, x, 0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0).to(tl.int64, bitcast=True))


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as the widest integer words (8, 4 or 1 bytes) its size and address allow."""
    raw = t.reshape(-1).view(torch.uint8)
    nbytes = raw.numel()
    if nbytes % 8 == 0 and raw.data_ptr() % 8 == 0:
        return raw.view(torch.int64)
    if nbytes % 4 == 0 and raw.data_ptr() % 4 == 0:
        return raw.view(torch.int32)
    return raw


def fingerprints(tensors: list[torch.Tensor]) -> torch.Tensor:
    """int64 [len(tensors)] on their device (contiguous tensors, all on one device): each
    tensor's fingerprint. No host synchronization."""
    out = torch.zeros(len(tensors), dtype=torch.int64, device=tensors[0].device)
    for i, t in enumerate(tensors):
        words = _words(t)
        if words.numel():
            _fingerprint[(triton.cdiv(words.numel(), BLOCK),)](words, words.numel(), out[i:], BLOCK=BLOCK)
    return out


def byte_image(tensors: list[torch.Tensor]) -> torch.Tensor:
    """All the tensors' bytes, concatenated (a copy: one launch)."""
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])


class Snapshot:
    """What a case's inputs held before a call: fingerprints of the large ones, a byte copy of
    the others. ``changed(inputs)`` says, as device bools, which differ now."""

    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        self.large = [k for k, t in inputs.items() if t.is_contiguous() and t.numel() * t.element_size() >= SMALL_BYTES]
        self.small = [k for k in inputs if k not in self.large]
        self.fp = fingerprints([inputs[k] for k in self.large]) if self.large else None
        self.image = byte_image([inputs[k] for k in self.small]) if self.small else None

    def changed(self, inputs: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """(names, device bool) pairs: one per large input, one for all the small ones."""
        out: list[tuple[str, torch.Tensor]] = []
        if self.fp is not None:
            moved = fingerprints([inputs[k] for k in self.large]) != self.fp
            out += [(k, moved[i]) for i, k in enumerate(self.large)]
        if self.image is not None:
            now = byte_image([inputs[k] for k in self.small])
            out.append((", ".join(self.small), (now != self.image).any()))
        return out

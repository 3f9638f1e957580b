"""Input fingerprints: "did the call change this input?" without a copy of it.

The GPU fast path (harness.runner) hands an implementation views of the case's
own input tensors instead of copies. Before the first call it takes a
fingerprint of every input (one read of each); after a call, the same again.
Equal fingerprints say the input is unchanged; a changed one sends the case to
the full path, which copies every input as before, after the case's tensors are
rebuilt from its spec and seed.

The fingerprint of a tensor's bytes, read as 4-byte words w_i (bytes when its
size or address does not allow 4), is the wrapping 64-bit sum of
f(w_i, i) = xorshift32((w_i ^ (i * K1)) * K2), K1, K2 odd. For each i, f is a
bijection of w_i (xor with a constant, multiply by an odd constant and an xor
shift are each invertible mod 2^64), so a change to any single word always
changes the sum; changes to several words cancel only by a 2^-64 coincidence
of pseudo-random terms. Exact comparison stays with the full path, which runs
whenever the fingerprint moves. A guard zone, whose every byte must still hold its fill, is
counted instead (its words that are not the fill): exact, and 0 while untouched whatever the
zone's size and address, in the same launch as the fingerprints.

Host time, not the GPU's, is what a fast-path check spends most on (a Triton
launch costs ~30 us of Python, a torch op ~8), so: up to PER_LAUNCH tensors are
fingerprinted by one launch, each into its own int64 slot of a device vector;
a snapshot keeps its fingerprints negated, so a vector that starts from them
(``Snapshot.board``) and has the later fingerprints added in holds 0 in the slot
of every unchanged tensor. No host synchronization anywhere here.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from mlafuzz.harness.fast.launch import Launchers
from mlafuzz.harness.memory.bits import word_view

BLOCK = 4096
PER_LAUNCH = 8


@triton.jit
def _fold(addr, n, block, out_ptr, fill, is_bytes, mirror, sign, BLOCK: tl.constexpr):
    """Adds sign x (this block's share of the fingerprint of the n words at address ``addr``) to
    out[0] (and to out[mirror] too where mirror != 0); with ``fill`` >= 0 (a guard zone) instead
    the count of its words other than that byte repeated. The words are 4 bytes, or 1 where
    ``is_bytes``: a runtime branch, so that one compiled kernel serves both widths."""
    offs = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    # A byte is zero-extended and a 4-byte word sign-extended to 64 bits, as the typed loads of
    # each width did; a zone's fill is the byte, or the byte repeated (truncated to 32 bits).
    if is_bytes != 0:
        raw = tl.load(addr.to(tl.pointer_type(tl.uint8)) + offs, mask=inside, other=0).to(tl.int32)
        pattern = fill
    else:
        raw = tl.load(addr.to(tl.pointer_type(tl.int32)) + offs, mask=inside, other=0)
        pattern = (fill.to(tl.int64) * 0x01010101).to(tl.int32)
    w = raw.to(tl.int64).to(tl.uint64, bitcast=True)
    idx = offs.to(tl.uint64, bitcast=True)
    x = (w ^ (idx * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 32)
    # A zone is exact: 0 while every byte holds the fill (no fingerprint of the fill to compute
    # per zone layout).
    other = (raw != pattern).to(tl.uint64)
    x = tl.where(fill >= 0, other, x)
    x = tl.where(inside, x, 0)
    share = tl.sum(x, axis=0).to(tl.int64, bitcast=True) * sign
    tl.atomic_add(out_ptr, share)
    if mirror != 0:
        tl.atomic_add(out_ptr + mirror, share)


# The launch's scalars (sizes, slots) change with every case: specializing on them (Triton's
# default: == 1, divisible by 16) compiled a new variant for most new cases, seconds each. The
# tensors go in as addresses (ints), not pointers: Triton keys a pointer's variant by its dtype
# and alignment, and each combination of word widths over the 8 tensors was a variant of its own
# (~1.7 s each on an H100 for the 8 inlined bodies, in every worker of a cold run). One kernel
# with one body now serves every launch: a program picks its tensor with scalar selects.
# Each argument also costs host time at every launch (~1 us): the programs' split is computed here
# from the sizes rather than passed. The sign (+1, or -1 for a snapshot) is an argument too.
_SCALARS = ["mirror", "sign"] + [f"{c}{j}" for j in range(PER_LAUNCH) for c in "ans"]
_BYTES = tl.constexpr(1 << 25)  # in a tensor's code: its words are bytes (above ``_code``'s fill + 1)


@triton.jit
def _pick(pid, end, a, n, code, start, addr_j, n_j, code_j, BLOCK: tl.constexpr):
    """The next tensor (a, n, code, start) if program ``pid`` lies at or past ``end``, where the
    tensor before it ends; and where that one ends."""
    later = pid >= end
    return (
        tl.where(later, addr_j, a),
        tl.where(later, n_j, n),
        tl.where(later, code_j, code),
        tl.where(later, end, start),
        end + tl.cdiv(n_j, BLOCK),
    )


# out_ptr takes scalar atomics only: its alignment (a board is a slice of the snapshot's store, 8
# bytes per slot in) would make a variant of its own.
@triton.jit(do_not_specialize=_SCALARS, do_not_specialize_on_alignment=["out_ptr"])
def _fingerprints(
    out_ptr,
    mirror,
    sign,
    a0,
    n0,
    s0,
    a1,
    n1,
    s1,
    a2,
    n2,
    s2,
    a3,
    n3,
    s3,
    a4,
    n4,
    s4,
    a5,
    n5,
    s5,
    a6,
    n6,
    s6,
    a7,
    n7,
    s7,
    BLOCK: tl.constexpr,
):
    """Tensor j (n_j words at address a_j) owns the programs after tensor j - 1's and adds sign x
    its fingerprint into out[s_j % 2**16] (and out[that + mirror], mirror != 0). A program finds
    its tensor with scalar compares, uniform over the program; an unused slot has no programs."""
    pid = tl.program_id(0)
    a, n, code, start, end = a0, n0, s0, pid * 0, tl.cdiv(n0, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a1, n1, s1, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a2, n2, s2, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a3, n3, s3, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a4, n4, s4, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a5, n5, s5, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a6, n6, s6, BLOCK)
    a, n, code, start, end = _pick(pid, end, a, n, code, start, a7, n7, s7, BLOCK)
    if pid < end:
        fill = ((code >> 16) & 0x1FF) - 1
        _fold(a, n, pid - start, out_ptr + (code & 0xFFFF), fill, code & _BYTES, mirror, sign, BLOCK)


def _code(slot: int, fill: int | None, words: torch.Tensor) -> int:
    """A tensor's code argument: the slot, a guard zone's fill byte + 1 above its 16 bits, and
    ``_BYTES`` when its words are bytes."""
    assert 0 <= slot < 1 << 16, slot
    code = slot if fill is None else slot | (fill + 1) << 16
    return code | _BYTES.value if words.element_size() == 1 else code


def add_words(
    out: torch.Tensor,
    items: Sequence[tuple[torch.Tensor, int] | tuple[torch.Tensor, int, int]],
    *,
    sign: int = 1,
    launchers: Launchers | None = None,
    mirror: int = 0,
) -> None:
    """out[slot] += sign x fingerprint for each (words, slot) of ``items`` (``word_view``s, on
    out's device; out int64): one launch per PER_LAUNCH tensors. Tensors sharing a slot add up.
    An item (words, slot, fill) is a guard zone: out[slot] += sign x the count of its words that
    are not the byte ``fill`` repeated (0 while untouched, exactly), in the same launch.
    ``mirror``: each also added into out[slot + mirror] (a snapshot's board, made in one pass)."""
    launch = (launchers or Launchers())(_fingerprints)
    work = [(item[0], _code(item[1], item[2] if len(item) > 2 else None, item[0])) for item in items if item[0].numel()]
    for at in range(0, len(work), PER_LAUNCH):
        chunk = work[at : at + PER_LAUNCH]
        args: list = [out, mirror, sign]
        programs = 0
        for w, code in chunk:
            programs += -(-w.numel() // BLOCK)  # not triton.cdiv: ~5 us a call from the host
            args += [w.data_ptr(), w.numel(), code]
        # Unused slots (no program reaches them: 0 words) repeat the last address: Triton keys an
        # int by whether it fits in int32, and an address never does.
        args += [args[-3], 0, 0] * (PER_LAUNCH - len(chunk))
        launch(programs, args, {"BLOCK": BLOCK})


def fingerprints(tensors: Sequence[torch.Tensor], *, launchers: Launchers | None = None) -> torch.Tensor:
    """int64 [len(tensors)] on their device (all on one device): each tensor's fingerprint."""
    out = torch.zeros(len(tensors), dtype=torch.int64, device=tensors[0].device)
    add_words(out, [(word_view(t), i) for i, t in enumerate(tensors)], launchers=launchers)
    return out


class Snapshot:
    """What a case's inputs held before a call: the negated fingerprint of each (in ``names``
    order), int64 on their device. Add the fingerprints of the same input tensors after a call
    into a board (``board``, then ``add_words(board, snap.items())``): a nonzero slot is an input
    the call changed. ``slots``: that many more (zeroed) slots after the fingerprints on the
    board (``Snapshot.slots``): a check may set them during the calls, before the board is
    handed out, with no flag and copy of its own. ``room``: the first board, with up to that many
    extra slots, is made by the snapshot's own launch (its fingerprints written twice), not
    copied afterwards."""

    def __init__(
        self,
        inputs: dict[str, torch.Tensor],
        *,
        device: str | torch.device,
        launchers: Launchers | None = None,
        slots: int = 0,
        room: int = 0,
    ) -> None:
        self.names = list(inputs)
        self._launchers = launchers
        # The word views of the inputs, kept for the fingerprints after each call: the same
        # tensors, so the same views (a non-contiguous input's copy is taken again in changed()).
        self._words = [word_view(t) if t.is_contiguous() else None for t in inputs.values()]
        self._strided = {k: t for k, t in inputs.items() if not t.is_contiguous()}
        n = len(self.names)
        # [the negated fingerprints | the first board: them again, the slots, the room]
        self._store = torch.zeros(2 * n + slots + room, dtype=torch.int64, device=device)
        self.neg = self._store[:n]
        self.slots = self._store[2 * n : 2 * n + slots]
        self._room = room
        self._lent = False
        add_words(self._store, self.items(), sign=-1, launchers=launchers, mirror=n)

    def board(self, extra: int) -> torch.Tensor:
        """An int64 [len(names) + slots + extra] on the device: the negated fingerprints, the slots
        as set so far, then ``extra`` zeros. The first within the room is the snapshot's own (no
        copy: it is handed out once); any other a fresh copy."""
        n = len(self.names)
        if not self._lent and extra <= self._room:
            self._lent = True
            return self._store[n : 2 * n + self.slots.numel() + extra]
        return torch.nn.functional.pad(torch.cat([self.neg, self.slots]), (0, extra))

    def items(self, *, at: int = 0) -> list[tuple[torch.Tensor, int]]:
        """(words, slot) pairs of the snapshot's input tensors now, for add_words, slots from ``at``."""
        return [
            (w if w is not None else word_view(self._strided[k]), at + i)
            for i, (k, w) in enumerate(zip(self.names, self._words))
        ]

    def changed(self) -> list[str]:
        """The inputs whose bytes differ from the snapshot's (one host sync)."""
        board = self.neg.clone()
        add_words(board, self.items(), launchers=self._launchers)
        return [k for k, v in zip(self.names, board.tolist()) if v]

"""Input fingerprints (harness.fingerprint): the fast path's "did the call change this input?"."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from mlafuzz.harness.fast.fingerprint import Snapshot, add_words, fingerprints  # noqa: E402
from mlafuzz.harness.fast.launch import Launcher, Launchers  # noqa: E402
from mlafuzz.harness.memory.bits import word_view  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@given(
    nbytes=st.sampled_from([8 * 1000, 4 * 1001, 1003]),
    where=st.integers(0, 2**31),
    bit=st.integers(0, 7),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=12, deadline=None)
def test_flipping_any_bit_of_any_byte_moves_the_fingerprint(nbytes, where, bit, seed):
    """4- and 1-byte words (by size): a single changed word always moves the sum."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).to(DEV)
    other = t.clone()
    other[where % nbytes] ^= 1 << bit
    a, b = fingerprints([t, other]).tolist()
    assert a != b
    assert fingerprints([t.clone()]).tolist() == [a]  # and it depends on the bytes only


def test_swapping_two_words_moves_the_fingerprint():
    t = torch.arange(4096, dtype=torch.int64, device=DEV)
    swapped = t.clone()
    swapped[[10, 3000]] = swapped[[3000, 10]]
    assert fingerprints([t]).item() != fingerprints([swapped]).item()


def test_fingerprints_taken_together_in_one_launch_equal_each_taken_alone():
    """More tensors than one launch takes, of every word width, two of them empty."""
    gen = torch.Generator().manual_seed(7)
    sizes = [8 * 300, 4 * 77, 1003, 0, 16, 8 * 5000, 3, 0, 4 * 1001, 8, 4096 * 3 + 8]
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).to(DEV) for n in sizes]
    ts[2] = ts[2][1:]  # an odd address: bytes
    together = fingerprints(ts).tolist()
    assert together == [fingerprints([t]).item() for t in ts]
    assert together[3] == 0 and len(set(together)) == len(ts) - 1


def test_tensors_sharing_a_slot_add_up_and_a_negated_snapshot_cancels():
    a = torch.arange(1000, dtype=torch.int32, device=DEV)
    b = torch.arange(33, dtype=torch.uint8, device=DEV)
    out = torch.zeros(2, dtype=torch.int64, device=DEV)
    add_words(out, [(word_view(a), 1), (word_view(b), 1)])
    alone = fingerprints([a, b]).tolist()
    assert out.tolist()[1] == (alone[0] + alone[1] + 2**63) % 2**64 - 2**63
    add_words(out, [(word_view(a), 1), (word_view(b), 1)], sign=-1)
    assert out.tolist() == [0, 0]


def test_a_snapshot_names_each_changed_input_large_or_small():
    big = torch.zeros(2048, dtype=torch.int32, device=DEV)
    small_a = torch.ones(3, device=DEV)
    small_b = torch.zeros((), dtype=torch.int64, device=DEV)
    strided = torch.zeros(8, 6, dtype=torch.int16, device=DEV)[:, ::2]  # fingerprinted from a copy
    inputs = {"big": big, "a": small_a, "b": small_b, "strided": strided}
    snap = Snapshot(inputs, device=DEV)
    assert snap.changed() == []
    big[77] = 5
    small_b.fill_(1)
    strided[3, 1] = 9
    assert snap.changed() == ["big", "b", "strided"]


def test_a_snapshots_own_board_holds_what_a_copy_would_and_writing_it_leaves_the_snapshot_whole():
    """The first board within the room is written by the snapshot's own launch (no copy after it):
    the negated fingerprints, the slots as a check set them during the calls, zeros; the snapshot
    and any later board are untouched by what is added into it."""
    inputs = {"a": torch.arange(5000, dtype=torch.int32, device=DEV), "b": torch.ones(7, device=DEV)}
    snap = Snapshot(inputs, device=DEV, slots=2, room=3)
    neg = [-v for v in fingerprints(list(inputs.values())).tolist()]
    snap.slots[1] = 2  # a prefill's flag, set before the board is handed out
    own = snap.board(3)
    assert own.tolist() == neg + [0, 2, 0, 0, 0] and snap.neg.tolist() == neg
    add_words(own, snap.items())
    assert own.tolist() == [0, 0, 0, 2, 0, 0, 0]
    assert snap.neg.tolist() == neg and snap.changed() == []
    assert snap.board(1).tolist() == neg + [0, 2, 0]  # a copy from here on


def test_every_board_of_a_snapshot_starts_from_its_negated_fingerprints_and_zeros():
    """Every board is a copy of the negated fingerprints, zeros after them, and a check writing
    into one changes neither the snapshot nor the next board."""
    inputs = {"a": torch.arange(5000, dtype=torch.int32, device=DEV), "b": torch.ones(7, device=DEV)}
    snap = Snapshot(inputs, device=DEV)
    neg = snap.neg.tolist()
    assert all(neg) and neg == [-v for v in fingerprints(list(inputs.values())).tolist()]
    first = snap.board(3)
    assert first.tolist() == neg + [0, 0, 0]
    first.fill_(7)
    add_words(first, snap.items())
    assert snap.neg.tolist() == neg
    assert snap.board(2).tolist() == neg + [0, 0] and snap.board(20).tolist()[:2] == neg
    later = snap.board(2)
    add_words(later, snap.items())
    assert later.tolist() == [0, 0, 0, 0] and snap.changed() == []


@pytest.mark.parametrize("start, nbytes", [(0, 4096), (4, 4100), (1, 4096), (0, 1001)])
@pytest.mark.parametrize("fill", [0xA5, 0x5A, 0x00, 0xFF])
def test_a_guard_zone_counts_zero_while_it_holds_its_fill_and_any_written_byte_moves_it(start, nbytes, fill):
    """A zone's slot counts its words that no longer hold the fill (each word width an address and
    size give): 0 untouched, whatever its layout, and not 0 after one byte changed, beside a
    fingerprinted tensor in the same launch that keeps its own slot."""
    zone = torch.full((nbytes + 8,), fill, dtype=torch.uint8, device=DEV)[start : start + nbytes]
    other = torch.arange(5, dtype=torch.int32, device=DEV)
    out = torch.zeros(2, dtype=torch.int64, device=DEV)
    add_words(out, [(word_view(other), 0), (word_view(zone), 1, fill)])
    assert out.tolist() == [fingerprints([other]).item(), 0]
    zone[nbytes // 2] = fill ^ 1
    zone[0] = fill ^ 0x80
    out.zero_()
    add_words(out, [(word_view(zone), 1, fill), (word_view(other), 0)])
    assert out.tolist() == [fingerprints([other]).item(), 2]  # two words (or bytes) apart


class _KeyRecorder(Launchers):
    """Launchers whose launches record the variant Triton would compile (``Launcher.key``, from the
    kernel's own do_not_specialize lists) and launch nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set = set()

    def __call__(self, fn):
        if not hasattr(fn, "params"):  # interpreted: the jit function it wraps keys the same
            lists = ("do_not_specialize", "do_not_specialize_on_alignment")
            fn = JITFunction(fn.fn, **{k: v for k, v in fn.kwargs.items() if k in lists})
        launcher = Launcher(fn)
        keys = self.keys

        class _Record:
            def __call__(self, grid, args, constexprs, **options):
                keys.add((launcher.key(args), tuple(constexprs.items())))

        return _Record()


@pytest.mark.parametrize("op", ["gather", "convert", "writer", "nvfp4_gather", "nvfp4_writer"])
def test_every_fingerprint_launch_of_fuzzed_cases_is_one_compiled_variant(op):
    """Triton compiles a variant per specialization key. Keyed by pointer dtypes (each tensor's
    word width) and the sign, a run compiled 2-8 variants of the fingerprint launch, ~1.7 s each
    in every worker of a cold run; with 8- or 4-byte words chosen by size, 300 drawn gather cases
    needed 20. Every launch of a snapshot (minus, mirrored), of the check after a call (plus, with
    any guard zones) of every tensor layout drawn is now one variant."""
    from mlafuzz.harness.drive.fuzz import case_seed
    from mlafuzz.harness.fast.path import fast_op
    from mlafuzz.harness.ops.table import OPS
    from mlafuzz.tests.support.helpers import draw_spec, materialize

    opdef = OPS.get(op)
    rec = _KeyRecorder()
    launches = 0
    for i in range(60):
        seed = case_seed(0, op, i)
        case = materialize(draw_spec(op, seed=seed), seed, "cpu")
        takes = fast_op(OPS.get(op)).takes
        if takes is not None and not takes(case):  # the full path's alone (gather's host tier)
            continue
        inputs = {k: t for k, t in case.tensors.items() if t is not None and k not in opdef.inplace and t.numel()}
        snap = Snapshot(inputs, device="cpu", launchers=rec, room=2)
        items: list = snap.items()
        for g in (opdef.guarded(case, 0xA5) if opdef.guarded else {}).values():
            items += [(word_view(z), len(items), 0xA5) for z in g.zones()]
        add_words(torch.zeros(len(items), dtype=torch.int64), items, launchers=rec)
        launches += 2
    assert launches and len(rec.keys) == 1, sorted(map(str, rec.keys))


def test_empty_inputs_at_any_storage_offset_are_fingerprinted_without_error():
    """An empty view reports address 0 whatever its offset; a wider word view of it is refused."""
    base_bf16 = torch.zeros(8, 512, dtype=torch.bfloat16, device=DEV)
    base_u8 = torch.zeros(16, dtype=torch.uint8, device=DEV)
    inputs = {"rows": base_bf16.view(-1)[1:1].view(0, 512), "bytes": base_u8[2:2], "full": base_u8}
    snap = Snapshot(inputs, device=DEV)
    assert snap.changed() == []
    base_u8[5] = 1
    assert snap.changed() == ["full"]


def test_equal_bytes_at_addresses_of_different_alignment_are_the_same_bits():
    """One view's words may be 4 bytes and the other's bytes: compared as bytes then."""
    from mlafuzz.harness.memory.bits import differ_flag, same_bits

    base = torch.arange(40, dtype=torch.uint8, device=DEV)
    aligned = base[8:24]
    odd = base.clone()[7:25][1:17]  # the same 16 bytes, one byte past an aligned address
    assert same_bits(aligned, odd) and not bool(differ_flag(aligned, odd))
    odd[3] ^= 1
    assert not same_bits(aligned, odd) and bool(differ_flag(aligned, odd))


_PTX_SCRIPT = """
from mlafuzz.harness.fast.fingerprint import _fingerprints
sig = {p.name: "*i64" if p.name == "out_ptr" else "i64" if p.name[0] == "a" else "constexpr"
       if p.is_constexpr else "i32" for p in _fingerprints.params}
src = ASTSource(fn=_fingerprints, signature=sig, constexprs={"BLOCK": 4096})
triton.compile(src, target=GPUTarget("cuda", 90, 32))
print("OK")
"""


@pytest.mark.slow
def test_the_gpu_build_of_the_fingerprint_launch_compiles_offline_for_sm90():
    """The guard zones' exact count, the words' width, the tensor each program picks and the
    snapshot's second slot (``mirror``) are runtime branches the interpreter runs as Python: the
    one variant every launch uses compiles here."""
    from mlafuzz.tests.support.offline import compile_offline

    compile_offline(_PTX_SCRIPT)

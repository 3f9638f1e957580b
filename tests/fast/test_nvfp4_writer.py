"""The nvfp4 writer's fast check (harness/fast/nvfp4/writer.py) is the oracle: clear on the oracle's
cache under every writer revision, flagged on any changed byte or misplaced record, "cannot tell"
where it cannot, and through the runner every planted nvfp4 writer bug is still found."""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")  # slot_owners is a Triton kernel: without triton this module skips

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mlafuzz.generators.draw import Knobs  # noqa: E402
from mlafuzz.generators.ops.nvfp4_writer import Nvfp4WriterSpec, WriterRevision  # noqa: E402
from mlafuzz.generators.ops.writer import WriterValues  # noqa: E402
from mlafuzz.generators.spec import Paging  # noqa: E402
from mlafuzz.harness.fast.nvfp4 import writer as fast_nvfp4_writer  # noqa: E402
from mlafuzz.harness.fast.nvfp4.writer import _e2m1_code, _e4m3_value  # noqa: E402
from mlafuzz.harness.fast.path import Clear, Undecided  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.mutants.nvfp4_writer_bugs import NVFP4_WRITER_MUTANTS  # noqa: E402
from mlafuzz.oracles.formats import writer_rules  # noqa: E402
from mlafuzz.oracles.formats.minifloat import e2m1_rn_satfinite, e4m3_decode  # noqa: E402
from mlafuzz.oracles.formats.nvfp4_write import write_records  # noqa: E402
from mlafuzz.reports.findings import Severity  # noqa: E402
from mlafuzz.tests.support.helpers import (  # noqa: E402
    fast_path_hides_nothing,
    fast_verdict,
    materialize,
    resolve,
    run_case,
    session_with,
)
from mlafuzz.tests.support.offline import compile_offline  # noqa: E402
from tests.support.launches import counting_work  # noqa: E402
from tests.support.syncs import counting, cuda_syncs  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# On the CPU the check's kernel runs in Triton's interpreter, tens of ms per cache record: drawn
# cases there take small blocks and few spares (a default run's sizes on the GPU).
KNOBS = Knobs() if DEV == "cuda" else dataclasses.replace(Knobs(), block_sizes=(1, 3, 4), max_spare_blocks=1)
OP = OPS.get("nvfp4_writer")
REVISIONS = writer_rules.names()
FORMAT = fast_nvfp4_writer.FORMAT
RECORD = FORMAT.record_bytes
# SPEC 11.3's tie tile (codes 7,7,5,3 under mul_recip, 7,6,4,2 under div), then tiles whose amax is
# zero, a bf16 subnormal, the largest bf16, an inf, a NaN (left out of amax), a scale that
# saturates at 448 (amax / 6 past it), and one floored at 2^-9.
HARD_TILES = (
    [5.5, 4.6875, 2.34375, 1.171875],
    [0.0, -0.0],
    [2.0**-133, -(2.0**-130), 2.0**-126],
    [3.3895313892515355e38, -1.0, 0.5],
    [float("inf"), 1.0, -3.0],
    [float("nan"), 2.5, -0.75],
    [6.0 * 500, -6.0 * 448, 1.0],
    [-0.0009765625, 0.0029296875, 0.001953125],  # amax / 6 below the 2^-9 scale floor
)


def _hard_case(revision: str, *, tokens: int = 12, block_size: int = 4, padding: bool = True):
    """A bf16 case drawn with extreme values, every token's leading tiles replaced by HARD_TILES and
    its first RoPE values by saturation edges (432: the tie between 416 and 448; 464 and past: 448)."""
    spec = Nvfp4WriterSpec(
        num_tokens=tokens,
        paging=Paging(block_size=block_size, spare_blocks=1),
        values=WriterValues.EXTREME,
        padding=padding,
        writer_revision=WriterRevision(revision),
    )
    case = materialize(spec, 0, DEV)
    kv, pe = case.tensors["kv_c"], case.tensors["k_pe"]
    for i, tile in enumerate(HARD_TILES):
        kv[:, 16 * i : 16 * i + 16] = 0
        kv[:, 16 * i : 16 * i + len(tile)] = torch.tensor(tile, dtype=torch.float32).to(kv.dtype)
    pe[:, :4] = torch.tensor([432.0, 464.0, -1e4, float("inf")]).to(pe.dtype)
    return case


def _oracle_cache(case) -> torch.Tensor:
    """The whole cache after a correct call: its zero blocks, then the oracle's blocks past them."""
    full = case.tensors["kv_cache"].clone()
    full[case.zero_blocks.get("kv_cache", 0) :] = OP.oracle(case)["kv_cache"]
    return full


def _flag(case, after: torch.Tensor, **params) -> list[int] | None:
    """The check's two board slots for ``after`` (None: it cannot tell from the host side)."""
    if params:
        case = dataclasses.replace(case, params={**case.params, **params})
    flag = torch.zeros(2, dtype=torch.int64, device=DEV)
    if not fast_nvfp4_writer.check(case, {"kv_cache": after}, None, flag, None):
        return None
    return flag.tolist()


def _drawn(count: int, *, start: int = 0, knobs: Knobs = KNOBS) -> list:
    return [
        OPS.materialize(OPS.draw_spec("nvfp4_writer", seed=s, knobs=knobs), s, DEV) for s in range(start, start + count)
    ]


@pytest.mark.parametrize("revision", REVISIONS)
def test_clear_on_the_oracles_cache_under_each_revision_with_hard_bf16_tiles(revision):
    case = _hard_case(revision)
    assert case.tensors["kv_c"].dtype == torch.bfloat16
    # The tiles are hard for this check: the revisions write them differently.
    others = {
        name: write_records(
            kv_c=case.tensors["kv_c"],
            k_pe=case.tensors["k_pe"],
            kv_cache=case.tensors["kv_cache"],
            slot_mapping=case.tensors["slot_mapping"],
            revision=name,
        )
        for name in REVISIONS
    }
    assert len({bytes(c.cpu().reshape(-1).numpy()) for c in others.values()}) == len(REVISIONS)
    assert _flag(case, _oracle_cache(case)) == [0, 0]
    for name, other in others.items():
        if name != revision:
            assert _flag(case, other) == [1, 0], name


def test_clear_on_the_oracles_cache_for_drawn_cases_of_every_value_pool_and_zero_blocks():
    cases = _drawn(40)
    assert {c.spec.values for c in cases} == set(WriterValues)
    assert any(c.zero_blocks for c in cases) and any(c.spec.num_tokens == 0 for c in cases)
    # kv_c and k_pe as columns of one [T, 576] tensor and as their own, bf16 and fp16, padded slots
    assert {(c.spec.inputs_view.value, c.tensors["kv_c"].dtype, c.spec.padding) for c in cases} >= {
        (view, dtype, True) for view in ("columns", "plain") for dtype in (torch.bfloat16, torch.float16)
    }
    for case in cases:
        assert _flag(case, _oracle_cache(case)) == [0, 0], case.case_id


@triton.jit
def _codes_kernel(q_ptr, e2m1_ptr, N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(e2m1_ptr + i, _e2m1_code(tl.load(q_ptr + i)))


@triton.jit
def _e4m3_value_kernel(o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, _e4m3_value(i))


def test_the_kernels_e2m1_code_and_e4m3_value_are_the_oracles_on_every_boundary_and_random_bits():
    values = torch.empty(128, dtype=torch.float32, device=DEV)
    _e4m3_value_kernel[(1,)](values, N=128)
    bytes_ = torch.arange(0x7F, dtype=torch.uint8)
    assert torch.equal(values[:0x7F].cpu().view(torch.int32), e4m3_decode(bytes_).view(torch.int32))
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31, (1 << 14,), generator=gen, dtype=torch.int64).to(torch.int32)
    edges = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 1e30])
    edges = torch.cat([edges, torch.tensor([float("inf"), float("nan"), 2.0**-149, 2.0**-126])])
    near = torch.cat([edges, edges.nextafter(torch.full_like(edges, 1e38)), edges.nextafter(torch.zeros_like(edges))])
    q = torch.cat([bits.view(torch.float32), near, -near, torch.randn(1 << 12, generator=gen) * 4])
    q = torch.cat([q, torch.zeros((-q.numel()) % 1024)])
    codes = torch.empty(q.shape, dtype=torch.int32, device=DEV)
    _codes_kernel[(q.numel() // 1024,)](q.to(DEV), codes, N=1024)
    assert torch.equal(codes.cpu(), e2m1_rn_satfinite(q).to(torch.int32))


@pytest.mark.parametrize(
    ("revision", "dtype"), [(r, torch.bfloat16) for r in REVISIONS] + [(REVISIONS[0], torch.float16)]
)
def test_clear_on_the_oracles_cache_for_every_16_bit_input_pattern(revision, dtype):
    """Every bf16 (fp16) pattern as kv_c values, shuffled and sorted by magnitude (so a tile spans
    about a binade: subnormal, huge, inf and NaN tiles), written to a shuffled pool."""
    gen = torch.Generator().manual_seed(1)
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)
    ordered = every.float().abs().sort().values.to(dtype)
    kv = torch.cat([every[torch.randperm(65536, generator=gen)], ordered]).reshape(-1, 512)
    pe = every[torch.randperm(65536, generator=gen)][: kv.shape[0] * 64].reshape(-1, 64)
    n, bs = kv.shape[0], 16
    cache = torch.randint(0, 256, (n // bs + 2, bs, RECORD), generator=gen, dtype=torch.int32).to(torch.uint8)
    slots = torch.randperm(cache.shape[0] * bs, generator=gen)[:n]
    t = {"kv_c": kv.to(DEV), "k_pe": pe.to(DEV), "kv_cache": cache.to(DEV), "slot_mapping": slots.to(DEV)}
    after = write_records(**t, revision=revision)
    flag = torch.zeros(2, dtype=torch.int64, device=DEV)
    assert fast_nvfp4_writer.nvfp4_records_flag(
        kv_c=t["kv_c"],
        k_pe=t["k_pe"],
        kv_cache_before=t["kv_cache"],
        kv_cache_after=after,
        slot_mapping=t["slot_mapping"],
        flag=flag,
        revision=revision,
    )
    assert flag.tolist() == [0, 0]


def _written_and_free(case) -> tuple[int, int]:
    """(a slot some token writes, a slot of the case's pool none does), past the zero blocks."""
    slots = case.tensors["slot_mapping"].tolist()
    head = case.zero_blocks.get("kv_cache", 0) * case.tensors["kv_cache"].shape[1]
    owned = {s for s in slots if s >= 0}
    free = next(
        s for s in range(head, case.tensors["kv_cache"].shape[0] * case.tensors["kv_cache"].shape[1]) if s not in owned
    )
    return min(owned), free


def test_any_single_flipped_byte_of_a_written_or_unwritten_record_flags():
    """A flipped bit in a byte of each 8 of a record (a different byte and bit each time) and in each
    of its 32 scale bytes (the kernel finds them by the permutation), in the record a token writes
    and in one no token does (a one-token case: the interpreter's time grows with the records)."""
    case = _hard_case(REVISIONS[0], tokens=1, block_size=1, padding=False)
    good = _oracle_cache(case)
    written, free = _written_and_free(case)
    scale = FORMAT.plane("scale")
    for slot in (written, free):
        for byte in sorted({8 * w + w % 8 for w in range(RECORD // 8)} | set(range(scale.offset, scale.stop))):
            bad = good.clone()
            bad.view(-1, RECORD)[slot, byte] ^= 1 << (byte * 3 % 8)
            assert _flag(case, bad) == [1, 0], (slot, byte)


def test_a_byte_written_into_the_zero_blocks_flags():
    case = next(c for c in _drawn(40) if c.zero_blocks and c.spec.num_tokens)
    good = _oracle_cache(case)
    for at in (0, good.view(-1).shape[0] // 3, case.zero_blocks["kv_cache"] * good.shape[1] * RECORD - 1):
        bad = good.clone()
        bad.view(-1)[at] = 0x5A
        assert _flag(case, bad) == [1, 0], at


def test_a_token_written_to_the_wrong_slot_flags():
    case = _hard_case(REVISIONS[0])
    good = _oracle_cache(case)
    written, free = _written_and_free(case)
    moved = good.clone()
    rows, before = moved.view(-1, RECORD), case.tensors["kv_cache"].view(-1, RECORD)
    rows[free], rows[written] = rows[written].clone(), before[written]
    assert _flag(case, moved) == [1, 0]
    copied = good.clone()  # written to the right slot and to a wrong one as well
    copied.view(-1, RECORD)[free] = good.view(-1, RECORD)[written]
    assert _flag(case, copied) == [1, 0]


def test_repeated_or_out_of_range_slots_and_an_unknown_revision_cannot_tell():
    case = _hard_case(REVISIONS[0])
    t, good = case.tensors, _oracle_cache(case)
    slots = t["slot_mapping"]
    live = (slots >= 0).nonzero().reshape(-1).tolist()
    repeated = slots.clone()
    repeated[live[1]] = slots[live[0]]
    past = slots.clone()
    past[live[0]] = t["kv_cache"].shape[0] * t["kv_cache"].shape[1]
    for bad_slots in (repeated, past):
        other = dataclasses.replace(case, tensors={**t, "slot_mapping": bad_slots})
        assert _flag(other, good)[1] == 2
    assert _flag(case, good, nvfp4_revision="rn_bump.exact") is None
    differs = good.clone()
    differs.view(-1, RECORD)[_written_and_free(case)[0], 7] ^= 1
    assert _flag(case, differs, nvfp4_ties="either") == [0, 2]  # the full path's review counts ties
    assert _flag(case, good, nvfp4_ties="either") == [0, 0]
    assert _flag(case, good.view(torch.float8_e4m3fn)) is None  # not the oracle's uint8: the comparator's
    assert _flag(case, good[:, :2]) is None
    unknown = dataclasses.replace(case, params={**case.params, "nvfp4_revision": "rn_bump.exact"})
    assert fast_verdict(unknown, "torch") == Undecided(seen="")


def test_the_check_reads_nothing_back_to_the_host():
    """slot_owners' fill and launch, the record kernel's launch and, with zero blocks, one
    reduction: no sync of their own (the path's one read of the board is the case's only one)."""
    cases = _drawn(12)
    assert any(c.zero_blocks for c in cases)
    expected = [_oracle_cache(c) for c in cases]
    for case, exp in zip(cases, expected):
        flag = torch.zeros(2, dtype=torch.int64, device=DEV)
        with counting() as count:
            assert fast_nvfp4_writer.check(case, {"kv_cache": exp}, None, flag, None)
        assert count.total == 0, (case.case_id, dict(count.sites))


def _mutant_cases(entry, count: int) -> list:
    """Drawn cases of a default run's sizes, under the writer revision the mutant is judged by."""
    return _drawn(count, knobs=dataclasses.replace(KNOBS, **dict(entry.draws)))


@pytest.mark.parametrize("mutant", [e.name for e in NVFP4_WRITER_MUTANTS])
def test_every_nvfp4_writer_mutant_is_still_found_with_its_kind_through_the_fast_path(mutant):
    """Where the full path finds the planted bug, the fast check itself flags the case (not a
    "cannot tell") and a run that starts on the fast path names the bug's kind."""
    entry = resolve("nvfp4_writer", mutant)
    cases = _mutant_cases(entry, 40)
    assert fast_path_hides_nothing(entry, cases, enough=3), f"{mutant}: no drawn case showed its bug"
    shown = next(c for c in cases if run_case(case=c, entry=entry, fast=False).findings)
    assert fast_verdict(shown, mutant).seen.startswith("gave outputs the fused check found different")


def test_under_ties_either_a_differing_record_is_cannot_tell_and_the_run_reports_the_full_paths_tie_info():
    """The check knows no ties: under --ties either a record that differs is "cannot tell" (not a
    mismatch the full path would then call unreproduced), so a writer that differs on exact ties
    only gets what the full path alone gives it, a "bit-exact except N ties" info, and nothing more."""
    entry = resolve("nvfp4_writer", "nvfp4_writer_div")
    tied = 0
    for case in _drawn(16, knobs=dataclasses.replace(KNOBS, nvfp4_ties="either")):
        full = run_case(case=case, entry=entry, fast=False).findings
        fast = run_case(case=case, entry=entry, fast=True).findings
        assert [(f.kind, f.severity, f.message) for f in fast] == [(f.kind, f.severity, f.message) for f in full]
        if full:
            assert all(f.severity is Severity.INFO and f.extra["tie_hits"] > 0 for f in full)
            assert fast_verdict(case, entry.name) == Undecided(seen="")
            tied += 1
    assert tied


def test_a_packed_cache_view_is_left_to_the_full_path_and_a_plain_one_is_taken_whatever_the_spec_says():
    case = next(c for c in _drawn(20) if c.spec.layers > 1)  # the nvfp4 generator builds no packed cache
    assert fast_nvfp4_writer.takes(case)
    cache = case.tensors["kv_cache"]
    packed = torch.zeros((2,) + tuple(cache.shape), dtype=cache.dtype, device=DEV)
    packed[1] = cache
    layer = dataclasses.replace(case, tensors={**case.tensors, "kv_cache": packed[1]})
    assert not fast_nvfp4_writer.takes(layer)
    assert fast_verdict(layer, "torch") == Undecided(seen="", ran=False)


def test_our_torch_writer_is_clear_on_the_fast_path_and_the_oracle_never_runs():
    def boom(case):
        raise AssertionError("the oracle ran although the fast check said the cache matches")

    no_oracle = session_with("nvfp4_writer", oracle=boom)
    entry = no_oracle.entry("nvfp4_writer", "torch")
    for i, case in enumerate(_drawn(16)):
        assert isinstance(fast_verdict(case, "torch", rerun=i % 2 == 0), Clear), case.case_id
        assert run_case(case=case, entry=entry, fast=True, in_session=no_oracle).findings == (), case.case_id


def _mean_work(cases: list, *, fast: bool) -> float:
    """The mean count of a case's device operations made by the harness (the implementation's own,
    the same on either path, left out), the first case left out (loads and pools made once)."""
    entry = resolve("nvfp4_writer", "torch")
    run_case(case=cases[0], entry=entry, fast=fast, rerun=True)
    total = 0
    for i, case in enumerate(cases[1:]):
        with counting_work() as work:
            assert not run_case(case=case, entry=entry, fast=fast, rerun=i % 4 == 0).findings
        total += work.total - sum(n for site, n in work.sites.items() if site.startswith("kernels/"))
    return total / (len(cases) - 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the Triton interpreter's launches (a CPU run)")
def test_a_fast_path_nvfp4_writer_case_makes_a_few_device_operations_against_the_full_paths():
    """Each launch and copy is a context's turn on a GPU shared by eight workers (issue 27): the
    check is three (slot_owners' fill and launch, the record kernel), so a fast-path case's harness
    operations (the check, the fingerprints, the sampled re-run's compare, one read; 12.6
    measured) stay a fraction of the full path's (input clones, two guarded runs' copies, the
    oracle's ~90 torch ops, the comparator; 83.5 measured)."""
    cases = _drawn(21)
    fast, full = _mean_work(cases, fast=True), _mean_work(cases, fast=False)
    assert fast <= 16 and fast <= 0.25 * full, (fast, full)


_PTX_SCRIPT = """
from mlafuzz.harness.fast.nvfp4.writer import FORMAT, _check_records
layout = {"RECORD_BYTES": FORMAT.record_bytes, "NOPE_AT": FORMAT.plane("nope").offset,
          "SCALE_AT": FORMAT.plane("scale").offset, "ROPE_AT": FORMAT.plane("rope").offset,
          "TILES": FORMAT.scales, "PAIRS": FORMAT.scale_block // 2, "ROPE_DIM": FORMAT.rope_dim, "RECS": 1,
          "DIFFER_AT": 0, "DIFFER": 1}
for use_cvt, bump, mul_recip in ((True, True, True), (False, False, False), (True, True, False)):
    sig = {"after8_ptr": "*u8", "before8_ptr": "*u8", "kv16_ptr": "*i16", "pe16_ptr": "*i16", "inv_ptr": "*i64",
           "bad_ptr": "*i64", "kv_stride": "i32", "pe_stride": "i32", "num_records": "i32", "is_bf16": "i32",
           **dict.fromkeys(["USE_ASM", "USE_CVT", "BUMP", "MUL_RECIP", *layout], "constexpr")}
    consts = {"USE_ASM": True, "USE_CVT": use_cvt, "BUMP": bump, "MUL_RECIP": mul_recip, **layout}
    try:
        k = triton.compile(ASTSource(fn=_check_records, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    except ImportError as exc:
        print("SKIP", exc)
        sys.exit(0)
    ptx = k.asm["ptx"]
    assert "div.rn.f32" in ptx, "no div.rn.f32"
    assert "div.full" not in ptx and "div.approx" not in ptx, "an inexact division"
    assert ("mul.rn.f32" in ptx) == mul_recip, "the quotient rule's multiply"
    assert ".ftz" not in ptx, "a flushed subnormal"
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == use_cvt, "the e4m3 encode is not the one asked for"
print("OK")
"""


@pytest.mark.slow
def test_the_gpu_build_compiles_offline_one_record_a_program_with_ieee_arithmetic_and_no_flush():
    compile_offline(_PTX_SCRIPT)


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_on_cuda_our_writers_are_clear_on_the_fast_path_and_each_revision_is_held(impl):
    for i, case in enumerate(_drawn(100)):
        assert isinstance(fast_verdict(case, impl, rerun=i % 2 == 0), Clear), case.case_id
    for revision in REVISIONS:
        case = _hard_case(revision)
        assert _flag(case, _oracle_cache(case)) == [0, 0], revision


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", [e.name for e in NVFP4_WRITER_MUTANTS])
def test_on_cuda_every_nvfp4_writer_mutant_is_still_found_with_its_kind(mutant):
    entry = resolve("nvfp4_writer", mutant)
    assert fast_path_hides_nothing(entry, _mutant_cases(entry, 60), enough=5), mutant


@pytest.mark.gpu
def test_on_the_gpu_the_check_makes_no_cuda_sync():
    """CUDA's own count (torch's sync debug mode warns at every blocking copy and stream sync)."""
    import warnings

    cases = _drawn(24)
    expected = [_oracle_cache(c) for c in cases]
    flags = [torch.zeros(2, dtype=torch.int64, device=DEV) for _ in cases]
    _flag(cases[0], expected[0])  # warm: the kernels' compiles
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for case, exp, flag in zip(cases, expected, flags):
                assert fast_nvfp4_writer.check(case, {"kv_cache": exp}, None, flag, None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert cuda_syncs(seen) == 0
    assert not any(f.tolist() != [0, 0] for f in flags)

"""The fused writer check agrees with the oracle: yes on the oracle's cache, no on any changed byte."""

from __future__ import annotations

import os
import textwrap

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.generators.ops.writer import InputDtype, WriterSpec, WriterValues  # noqa: E402
from mlafuzz.generators.spec import Paging  # noqa: E402
from mlafuzz.harness.fast.writer import (  # noqa: E402
    _e4m3fn_satfinite,
    _f32_bits_of_16,
    writer_records_flag,
)
from mlafuzz.oracles import codec  # noqa: E402
from mlafuzz.oracles.writer_scale import NEWEST, REVISIONS, scale_rule  # noqa: E402
from mlafuzz.tests.support.helpers import matches, materialize  # noqa: E402
from mlafuzz.tests.support.offline import compile_offline

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _expected(t, revision: str = NEWEST) -> torch.Tensor:
    # The fused check recomputes the scale rule of the revision it is given (SPEC section 7).
    return codec.write_records(
        kv_c=t["kv_c"], k_pe=t["k_pe"], kv_cache=t["kv_cache"], slot_mapping=t["slot_mapping"], revision=revision
    )


def _match(t, after: torch.Tensor, revision: str = NEWEST) -> bool:
    return matches(
        writer_records_flag(
            kv_c=t["kv_c"],
            k_pe=t["k_pe"],
            kv_cache_before=t["kv_cache"],
            kv_cache_after=after,
            slot_mapping=t["slot_mapping"],
            revision=revision,
        )
    )


def _case(values: WriterValues, dtype: InputDtype, seed: int, padding: bool = True):
    spec = WriterSpec(
        num_tokens=10, paging=Paging(block_size=4, spare_blocks=1), input_dtype=dtype, values=values, padding=padding
    )
    return materialize(spec, seed, DEV).tensors


def _tensors(kv_c: torch.Tensor, k_pe: torch.Tensor, slots: torch.Tensor, num_blocks: int, bs: int) -> dict:
    gen = torch.Generator().manual_seed(7)
    cache = torch.randint(0, 256, (num_blocks, bs, 656), generator=gen, dtype=torch.int32).to(torch.uint8)
    return {"kv_c": kv_c.to(DEV), "k_pe": k_pe.to(DEV), "kv_cache": cache.to(DEV), "slot_mapping": slots.to(DEV)}


@triton.jit
def _decode_kernel(h_ptr, o_ptr, is_bf16, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, _f32_bits_of_16(tl.load(h_ptr + i).to(tl.int32) & 0xFFFF, is_bf16))


@triton.jit
def _encode_kernel(y_ptr, o_ptr, N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(o_ptr + i, _e4m3fn_satfinite(tl.load(y_ptr + i)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_16_bit_decode_is_torchs_exact_conversion_for_every_pattern(dtype):
    h = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    out = torch.empty(65536, dtype=torch.int32, device=DEV)  # written by the kernel, on DEV
    _decode_kernel[(1,)](h.to(DEV), out, int(dtype == torch.bfloat16), N=65536)
    ref = h.view(dtype).float()
    nan = torch.isnan(ref)
    got = out.cpu().view(torch.float32)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int32)[~nan], ref.view(torch.int32)[~nan])


def test_the_e4m3fn_encode_is_the_oracles_on_random_bits_and_every_rounding_boundary():
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31, (1 << 15,), generator=gen, dtype=torch.int64).to(torch.int32)
    grid = torch.arange(0, 4 * 1024, dtype=torch.float32) / 2**12  # quarter steps of the subnormal quantum
    halves = torch.cat([grid, 2.0**-6 + grid / 64, (torch.arange(0, 64) + 0.5) * 2.0**-9 * 8])
    top = torch.tensor(
        [
            416.0,
            432.0,
            440.0,
            448.0,
            456.0,
            463.9,
            464.0,
            464.1,
            480.0,
            1e30,
            float("inf"),
            float("nan"),
            2.0**-126,
            2.0**-149,
            0.0,
        ]
    )
    near = torch.cat([halves, top])
    near = torch.cat(
        [
            near,
            near.nextafter(torch.full_like(near, float("inf"))),
            near.nextafter(torch.full_like(near, -float("inf"))),
        ]
    )
    y = torch.cat([bits.view(torch.float32), near, -near, torch.randn(1 << 14, generator=gen) * 64])
    y = torch.cat([y, torch.zeros((-y.numel()) % 1024)])
    out = torch.empty(y.shape, dtype=torch.int32, device=DEV)
    _encode_kernel[(y.numel() // 1024,)](y.to(DEV), out, N=1024)
    assert torch.equal(out.cpu(), codec._f32_to_e4m3fn_satfinite(y).to(torch.int32))


def _hard_tiles(dtype: torch.dtype) -> torch.Tensor:
    """Tokens [n, 512] of hard tiles: every 16-bit pattern of the dtype (shuffled, and sorted so each tile
    spans about a binade), zeros, NaN-only, inf-holding, subnormal-only tiles and ratios reaching the
    e4m3fn subnormals."""
    gen = torch.Generator().manual_seed(1)
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)
    shuffled = every[torch.randperm(65536, generator=gen)]
    ordered = every.float().abs().sort().values.to(dtype)  # NaNs last, tiles of similar magnitudes
    nan, inf = float("nan"), float("inf")
    special = torch.zeros(6, 4, 128)
    special[0, 1] = nan  # all-NaN tile: scale FLT_MIN
    special[0, 2, ::3] = nan
    special[0, 3, 5] = -0.0
    special[1, 0, 7] = inf  # inf amax: scale inf, x / inf = +-0, inf / inf = NaN
    special[1, 1, 9] = -inf
    special[1, 1, 10] = nan
    special[1, 2] = torch.randn(128, generator=gen)
    special[1, 2, 0] = -inf
    smallest = torch.tensor(0x0001, dtype=torch.int16).view(dtype).float()
    special[2] = smallest * torch.randint(-3, 4, (4, 128), generator=gen)  # subnormal-only tiles
    special[3] = torch.finfo(dtype).max * torch.sign(torch.randn(4, 128, generator=gen))
    amax = torch.exp2(torch.randint(-20, 20, (2, 4, 1), generator=gen).float())
    ratio = torch.exp2(-14 * torch.rand(2, 4, 128, generator=gen)) * torch.sign(torch.randn(2, 4, 128, generator=gen))
    special[4:] = amax * ratio  # x / scale down to 2**-14 * 448: e4m3fn subnormals and their ties
    special[4:, :, 0] = amax[..., 0]
    return torch.cat([shuffled.reshape(-1, 512), ordered.reshape(-1, 512), special.reshape(-1, 512).to(dtype)])


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.slow
def test_yes_on_the_oracles_cache_for_every_16_bit_input_pattern_and_hard_tiles(dtype, revision):
    kv_c = _hard_tiles(dtype)
    n = kv_c.shape[0]
    gen = torch.Generator().manual_seed(2)
    k_pe = torch.randint(-(2**15), 2**15, (n, 64), generator=gen, dtype=torch.int32).to(torch.int16).view(dtype)
    slots = torch.randperm(n + 6, generator=gen)[:n]
    slots[::9] = -1  # padding tokens
    t = _tensors(kv_c, k_pe, slots, num_blocks=(n + 6) // 2, bs=2)
    after = _expected(t, revision)
    assert _match(t, after, revision)
    # ... and no on a revision's cache whose scale rule is the other one (revisions of one rule
    # make the same cache): the two rules differ on almost every tile.
    other = next(r for r in REVISIONS if scale_rule(r) != scale_rule(revision))
    assert not _match(t, _expected(t, other), revision)


def test_an_unknown_revision_is_cannot_tell_not_a_verdict():
    t = _case(WriterValues.NORMAL, InputDtype.BF16, 3, padding=False)
    assert (
        writer_records_flag(
            kv_c=t["kv_c"],
            k_pe=t["k_pe"],
            kv_cache_before=t["kv_cache"],
            kv_cache_after=_expected(t),
            slot_mapping=t["slot_mapping"],
            revision="2026-08",
        )
        is None
    )


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("dtype", list(InputDtype))
@pytest.mark.parametrize("values", list(WriterValues))
@given(seed=st.integers(0, 2**32 - 1), where=st.integers(0, 2**31), bit=st.integers(0, 7))
@settings(max_examples=2, deadline=None)
@pytest.mark.slow
def test_yes_on_the_oracles_cache_no_on_any_single_bit_flip(values, dtype, revision, seed, where, bit):
    t = _case(values, dtype, seed)
    after = _expected(t, revision)
    assert _match(t, after, revision)
    flat = after.view(-1, 656)
    slots = t["slot_mapping"]
    written = slots[slots >= 0].cpu()
    if written.numel():
        s, byte = int(written[where % written.numel()]), (where // 7) % 656  # codes, scale bytes, rope bytes
        flat[s, byte] ^= 1 << bit
        assert not _match(t, after, revision)
        flat[s, byte] ^= 1 << bit
    unwritten = sorted(set(range(flat.shape[0])) - set(written.tolist()))
    assert unwritten  # the spare block
    s = unwritten[where % len(unwritten)]
    flat[s, (where // 11) % 656] ^= 1 << bit
    assert not _match(t, after, revision)


def test_every_byte_region_of_a_written_record_is_checked():
    t = _case(WriterValues.NORMAL, InputDtype.BF16, 3, padding=False)
    after = _expected(t)
    s = int(t["slot_mapping"][0])
    for byte in (0, 127, 128, 511, 512, 515, 527, 528, 600, 655):
        bad = after.clone()
        bad.view(-1, 656)[s, byte] ^= 0x80
        assert not _match(t, bad), byte


def test_duplicate_out_of_range_and_short_inputs_say_no_without_raising():
    t = _case(WriterValues.NORMAL, InputDtype.FP16, 4, padding=False)
    after = _expected(t)
    assert _match(t, after)
    dup = dict(t, slot_mapping=t["slot_mapping"].clone())
    dup["slot_mapping"][3] = dup["slot_mapping"][7]
    assert _match(dup, _expected(dup)) is False  # the oracle's last-token-wins cache: still a no
    assert _match(dup, after) is False
    # ... and a "cannot tell" (2), never a "differs" (1): the runner reports a fast-path "differs"
    # the full check cannot reproduce as nondeterminism. In the runner's own flag too.
    args = dict(
        kv_c=dup["kv_c"],
        k_pe=dup["k_pe"],
        kv_cache_before=dup["kv_cache"],
        kv_cache_after=_expected(dup),
        slot_mapping=dup["slot_mapping"],
    )
    assert writer_records_flag(**args).tolist() == [2]
    board = torch.zeros(2, dtype=torch.int64, device=DEV)
    assert writer_records_flag(**args, flag=board) is board and board.tolist() == [0, 2]
    oob = dict(t, slot_mapping=t["slot_mapping"].clone())
    oob["slot_mapping"][2] = t["kv_cache"].shape[0] * t["kv_cache"].shape[1]
    assert _match(oob, after) is False
    short = dict(t, kv_c=t["kv_c"][:5])
    assert _match(short, after) is False
    assert _match(t, after.view(torch.float8_e4m3fn)) is False  # the oracle's cache is uint8
    assert _match(t, after[:, :2]) is False


@pytest.mark.slow
def test_checks_of_interleaved_cases_and_a_smaller_cache_after_a_bigger_see_only_their_own_slots():
    """The slot -> token map is one buffer per device, reused without clearing: entries left by
    earlier checks (other slots, a larger cache, a duplicate's trouble mark) must read as empty."""
    a = _case(WriterValues.NORMAL, InputDtype.BF16, 11, padding=False)
    b = _case(WriterValues.NORMAL, InputDtype.BF16, 12, padding=False)
    big = _tensors(a["kv_c"], a["k_pe"], a["slot_mapping"] + 256, 40, 16)  # slots past a's cache
    dup = dict(b, slot_mapping=b["slot_mapping"].clone())
    dup["slot_mapping"][1] = dup["slot_mapping"][0]
    for t in (a, big, dup, b, a, b):
        args = dict(
            kv_c=t["kv_c"],
            k_pe=t["k_pe"],
            kv_cache_before=t["kv_cache"],
            kv_cache_after=_expected(t),
            slot_mapping=t["slot_mapping"],
        )
        if t is dup:
            assert writer_records_flag(**args).tolist() == [2]
            continue
        assert _match(t, _expected(t)), "a correct cache read as wrong"  # dup's trouble mark is not this check's
        wrong = _expected(t)
        wrong.view(-1, 656)[int(t["slot_mapping"][0]), 5] ^= 1
        assert not _match(t, wrong)
    untouched = dict(a, slot_mapping=torch.full_like(a["slot_mapping"], -1))  # writes nothing
    assert _match(untouched, untouched["kv_cache"].clone())


def test_layouts_extra_rows_int32_slots_and_fp8_input_cache():
    t = _case(WriterValues.WIDE, InputDtype.BF16, 5)
    after = _expected(t)
    n = t["slot_mapping"].shape[0]
    # kv_c / k_pe with extra rows (ignored) and a row stride that is not the width.
    wide = torch.zeros(n + 3, 2, 512, dtype=t["kv_c"].dtype, device=DEV)
    wide[:n, 1] = t["kv_c"]
    pe_t = torch.zeros(64, n + 2, dtype=t["k_pe"].dtype, device=DEV)
    pe_t[:, :n] = t["k_pe"].T
    variant = dict(t, kv_c=wide[:, 1], k_pe=pe_t.T, slot_mapping=t["slot_mapping"].to(torch.int32))
    assert variant["k_pe"].stride(1) != 1
    assert _match(variant, after)
    fp8 = dict(t, kv_cache=t["kv_cache"].view(torch.float8_e4m3fn))
    assert _match(fp8, after)
    none = dict(t, slot_mapping=torch.full_like(t["slot_mapping"], -1))
    assert _match(none, t["kv_cache"].clone())
    assert not _match(none, after)


@pytest.mark.parametrize("mutant", ["writer_scale_pow2", "writer_writes_padding", "writer_no_ceiling"])
def test_the_runner_skips_the_oracle_on_yes_and_a_mutant_is_still_found(mutant):
    import dataclasses

    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.run import run_case
    from mlafuzz.harness.ops.op import OpTable
    from mlafuzz.harness.ops.table import OPS
    from mlafuzz.reports.findings import Kind

    spec = WriterSpec(
        num_tokens=12, paging=Paging(block_size=4, spare_blocks=1), values=WriterValues.NORMAL, padding=True
    )
    # A case with padding whose slot 0 (where writes_padding puts a padded token) no token owns.
    case = next(
        c
        for c in (materialize(spec, s, DEV) for s in range(100))
        if -1 in (slots := c.tensors["slot_mapping"].tolist()) and 0 not in slots
    )

    def boom(case):
        raise AssertionError("the oracle ran although the fast check said the cache matches")

    no_oracle = Session(
        table=OpTable(tuple(dataclasses.replace(o, oracle=boom) if o.name == "writer" else o for o in OPS.ops))
    )
    assert run_case(session=no_oracle, case=case, entry=no_oracle.entry("writer", "torch"), fast=True).findings == ()
    real = Session(table=OPS)
    bad = run_case(session=real, case=case, entry=real.entry("writer", mutant), fast=True)
    assert Kind.VALUE_MISMATCH in {f.kind for f in bad.findings}


_PTX_SCRIPT = textwrap.dedent("""
    from mlafuzz.harness.fast.writer import _check_records
    from mlafuzz.oracles.formats.table import get
    fp8 = get("fp8_ds_mla")
    layout = {"RECORD_BYTES": fp8.record_bytes, "SCALE_AT": fp8.plane("scale").offset,
              "ROPE_AT": fp8.plane("rope").offset}
    for use_cvt, revision in ((True, 0), (False, 1), (True, 1), (False, 0)):  # the dtype is a runtime flag
        sig = {"after8_ptr": "*u8", "before8_ptr": "*u8", "kv16_ptr": "*i16", "pe16_ptr": "*i16", "inv_ptr": "*i64",
               "bad_ptr": "*i64", "kv_stride": "i32", "pe_stride": "i32", "is_bf16": "i32",
               "USE_ASM": "constexpr", "USE_CVT": "constexpr", "POW2_SCALE": "constexpr",
               **dict.fromkeys(layout, "constexpr")}
        src = ASTSource(fn=_check_records, signature=sig,
                        constexprs={"USE_ASM": True, "USE_CVT": use_cvt, "POW2_SCALE": bool(revision), **layout})
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        except ImportError as exc:
            print("SKIP", exc)
            sys.exit(0)
        ptx = k.asm["ptx"]
        assert "div.rn.f32" in ptx, "no div.rn.f32"
        assert "div.full" not in ptx and "div.approx" not in ptx, "an inexact division"
        assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == use_cvt, "the e4m3 encode is not the one asked for"
    print("OK")
""")


@pytest.mark.slow
def test_the_gpu_build_compiles_offline_with_ieee_division_and_the_asked_e4m3_encode():
    compile_offline(_PTX_SCRIPT)

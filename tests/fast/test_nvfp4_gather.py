"""The fused nvfp4 gather check (harness/fast/nvfp4/gather.py) agrees with the exact reader: its
expected rows are the oracle's bit for bit over every code x every scale byte and every RoPE byte;
it says yes on the oracle's rows and no on a flipped bit, an unwritten byte, a wrong record or a
re-run that differs; on the fast path every planted nvfp4 gather bug is still found with its kind
and our gathers come out Clear, judged there without the oracle. On the CPU the kernels run under
Triton's interpreter (small shapes); on the GPU the same tests run compiled."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from mlafuzz.generators.ops.gather import GatherRequest  # noqa: E402
from mlafuzz.generators.ops.nvfp4_gather import Nvfp4GatherSpec, Nvfp4Values  # noqa: E402
from mlafuzz.generators.spec import Paging  # noqa: E402
from mlafuzz.harness.fast import path  # noqa: E402
from mlafuzz.harness.fast.nvfp4.gather import nvfp4_prefill, nvfp4_rows_flag  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels.registry import default_registry  # noqa: E402
from mlafuzz.oracles.formats import nvfp4_gather as og  # noqa: E402
from mlafuzz.oracles.formats.nvfp4_read import dequant  # noqa: E402
from mlafuzz.oracles.formats.nvfp4_record import FORMAT, pack  # noqa: E402
from mlafuzz.tests.support.cuda_cases import gpu  # noqa: E402
from mlafuzz.tests.support.helpers import (  # noqa: E402
    draw_spec,
    fast_path_hides_nothing,
    fast_verdict,
    features,
    matches,
    materialize,
    resolve,
    run_case,
    session_with,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
OP = OPS.get("nvfp4_gather")
MUTANTS = sorted(e.name for e in default_registry().entries(op="nvfp4_gather", mutants=True))


def _call(cache: torch.Tensor) -> dict:
    """A gather of every record of ``cache`` [n, 1, 352], in order: one request, block size 1."""
    n = cache.shape[0]
    return dict(
        src_cache=cache,
        block_table=torch.arange(n, dtype=torch.int32, device=cache.device).reshape(1, n),
        workspace_starts=torch.zeros(1, dtype=torch.int32, device=cache.device),
        batch_size=1,
        seq_starts=None,
    )


def _every_pattern(device: str) -> torch.Tensor:
    """Records [8, 1, 352] holding every e2m1 code under every scale byte 0x00..0xFF (record r's
    block s has scale byte 32r + s, a different one per block, so a scale read from the wrong slot
    shows) and every RoPE byte, twice."""
    n = 256 // FORMAT.scales
    codes = torch.arange(FORMAT.nope_dim).remainder(16).to(torch.uint8).repeat(n, 1)
    scales = torch.arange(n * FORMAT.scales).to(torch.uint8).reshape(n, FORMAT.scales)
    rope = torch.arange(n * FORMAT.rope_dim).remainder(256).to(torch.uint8).reshape(n, FORMAT.rope_dim)
    return pack(codes=codes, scales=scales, rope=rope).reshape(n, 1, -1).to(device)


def _unlike(expected: torch.Tensor) -> torch.Tensor:
    """The prefill SPEC's oracle rows ask for, int16: each element's complement, 0 where NaN."""
    bits = expected.view(torch.int16)
    return torch.where(torch.isnan(expected), torch.zeros_like(bits), bits ^ -1)


def _expected_rows_are_the_exact_readers(device: str) -> None:
    cache = _every_pattern(device)
    call = _call(cache)
    want = dequant(cache.reshape(cache.shape[0], -1))
    assert bool(torch.isnan(want).any()) and bool((want.view(torch.int16) < 0).any())  # NaN and negative scales
    # The prefill writes the complement of each element the kernel expects (0 for a NaN): read
    # back, it is the kernel's expected rows themselves, compared with the oracle's bit for bit.
    fill = torch.empty_like(want)
    assert nvfp4_prefill(dst=fill, **call)
    assert torch.equal(fill.view(torch.int16), _unlike(want))
    assert matches(nvfp4_rows_flag(dst=want, **call))
    assert matches(nvfp4_rows_flag(dst=want, dst2=want.clone(), **call))


def test_the_expected_rows_are_the_exact_readers_for_every_code_under_every_scale_byte_and_every_rope_byte():
    _expected_rows_are_the_exact_readers(DEV)


@gpu
def test_on_the_gpu_the_expected_rows_are_the_exact_readers_for_every_code_scale_and_rope_byte():
    _expected_rows_are_the_exact_readers("cuda")


def _small_case(values: Nvfp4Values = Nvfp4Values.WRITTEN, seed: int = 3):
    spec = Nvfp4GatherSpec(
        requests=(
            GatherRequest(context_len=20, seq_start=5, length=9),
            GatherRequest(context_len=0),
            GatherRequest(context_len=7),
        ),
        paging=Paging(block_size=4, layout="shuffled"),
        values=values,
        ws_form="cumulative",
    )
    return materialize(spec, seed, DEV)


def _args(case) -> dict:
    t = case.tensors
    return dict(
        src_cache=t["src_cache"],
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
    )


def _oracle(case) -> torch.Tensor:
    return og.gather(total=case.params["total"], **_args(case))


def _flipped(dst: torch.Tensor, row: int, col: int, bit: int) -> torch.Tensor:
    bits = dst.view(torch.int16).clone()
    bits[row, col] ^= (1 << bit) if bit < 15 else -(1 << 15)
    return bits.view(torch.bfloat16)


def test_yes_on_the_oracles_rows_no_on_a_single_flipped_bit_of_any_bit_position_in_nope_and_rope():
    case = _small_case()
    want = _oracle(case)
    assert matches(nvfp4_rows_flag(dst=want, **_args(case)))
    rows = want.shape[0]
    finite = ~torch.isnan(want)
    # Every bit position, at columns of each NoPE tile (even and odd elements) and of the RoPE.
    cols = [0, 1, 130, 255, 383, 511, 512, 541, 575]
    for k, bit in enumerate(range(16)):
        row, col = (5 * k) % rows, cols[k % len(cols)]
        if not bool(finite[row, col]):
            row = int(finite[:, col].nonzero()[0])
        assert not matches(nvfp4_rows_flag(dst=_flipped(want, row, col, bit), **_args(case))), (row, col, bit)


def test_a_nan_element_may_hold_any_nan_payload_but_a_rerun_must_match_the_first_bit_for_bit():
    case = _small_case()
    want = _oracle(case)
    nan = torch.isnan(want)
    assert bool(nan.any())  # the RoPE bytes 0x7F / 0xFF
    other = want.view(torch.int16).clone()
    other[nan] = 0x7FFF
    other = other.view(torch.bfloat16)
    assert matches(nvfp4_rows_flag(dst=other, **_args(case)))
    assert not matches(nvfp4_rows_flag(dst=want, dst2=other, **_args(case)))


def test_a_row_read_from_the_wrong_record_or_a_rerun_that_differs_is_no_match():
    case = _small_case()
    want = _oracle(case)
    wrong = want.clone()
    wrong[4] = want[5]
    assert not matches(nvfp4_rows_flag(dst=wrong, **_args(case)))
    flipped = _flipped(want, 7, 300, 8)
    assert not matches(nvfp4_rows_flag(dst=want, dst2=flipped, **_args(case)))
    assert not matches(nvfp4_rows_flag(dst=flipped, dst2=want, **_args(case)))
    assert matches(nvfp4_rows_flag(dst=want, dst2=want.clone(), **_args(case)))
    assert nvfp4_rows_flag(dst=want, dst2=want[:-1], **_args(case)) is None  # cannot tell: not a dst


def test_a_prefilled_dst_is_a_match_only_once_every_byte_of_every_row_is_written():
    """The one-run write map: the prefill leaves no byte holding its expected value, so a dst is a
    match only where a kernel wrote all of it; a row left unwritten, or one byte of one element
    (a NaN one included), is no match."""
    case = _small_case()
    want = _oracle(case)
    dst = torch.empty_like(want)
    assert nvfp4_prefill(dst=dst, **_args(case))
    assert not matches(nvfp4_rows_flag(dst=dst, **_args(case)))
    fill, expected = dst.view(torch.uint8), want.view(torch.uint8)
    assert bool((fill != expected)[~torch.isnan(want).repeat_interleave(2, dim=1)].all())
    row_left = expected.clone()
    row_left[6] = fill[6]
    assert not matches(nvfp4_rows_flag(dst=row_left.view(torch.bfloat16), **_args(case)))
    nan_at = torch.isnan(want).nonzero()[0].tolist()
    for row, byte in [(0, 0), (3, 2 * 131 + 1), (nan_at[0], 2 * nan_at[1]), (nan_at[0], 2 * nan_at[1] + 1)]:
        partial = expected.clone()
        partial[row, byte] = fill[row, byte]
        assert not matches(nvfp4_rows_flag(dst=partial.view(torch.bfloat16), **_args(case))), (row, byte)


def test_an_unwritten_class_case_is_clear_when_exact_and_left_to_the_full_path_when_only_loosely_right():
    written, unwritten = _small_case(), _small_case(Nvfp4Values.UNWRITTEN)
    assert fast_verdict(unwritten, "torch", rerun=True) == path.Clear()
    assert fast_verdict(written, "torch", rerun=True) == path.Clear()

    # A gather that differs from the exact reading only where the contract is loose (a magnitude
    # read through a scale byte no writer makes; NaN-ness and sign kept): the fused check cannot
    # judge that ("cannot tell", nothing seen), and the full path finds nothing, no NONDETERMINISM.
    torch_gather = resolve("nvfp4_gather", "torch").load(DEV)
    loose = og.gather_loose(total=unwritten.params["total"], **_args(unwritten))
    assert loose.any()

    def loosely_right(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
        torch_gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
        x = dst.float()
        two = torch.where(x.abs() == 2, 3.0, 2.0).copysign(x)
        dst.copy_(torch.where(loose & ~x.isnan(), two, x).to(dst.dtype))

    assert fast_verdict(unwritten, "torch", fn=loosely_right) == path.Undecided(seen="")
    entry = resolve("nvfp4_gather", "torch")
    assert run_case(case=unwritten, entry=entry, fn=loosely_right, fast=True).findings == ()


def _drawn(count: int, device: str, values: Nvfp4Values = Nvfp4Values.WRITTEN) -> list:
    """The first ``count`` drawn cases of a default run's sizes of the scale class ``values``."""
    cases, seed = [], 0
    while len(cases) < count:
        spec = draw_spec("nvfp4_gather", seed=seed)
        if spec.values is values:
            cases.append(materialize(spec, seed, device))
        seed += 1
    return cases


@pytest.mark.parametrize("mutant", MUTANTS)
def test_every_planted_nvfp4_gather_bug_is_flagged_by_the_fused_check_and_named_by_the_full_path(mutant):
    entry = resolve("nvfp4_gather", mutant)
    assert fast_path_hides_nothing(entry, _drawn(6, DEV), enough=2) == 2, mutant


def _clear_without_the_oracle(impl: str, cases: list) -> int:
    """Each case judged Clear by the fast path (every other one with a re-run checked in the same
    pass), and a run of it finds nothing in a session whose oracle must not run; how many."""

    def boom(case):
        raise AssertionError("the oracle ran although the fused check judged the case")

    no_oracle = session_with("nvfp4_gather", oracle=boom)
    entry = no_oracle.entry("nvfp4_gather", impl)
    judged = 0
    for i, case in enumerate(cases):
        assert fast_verdict(case, impl, rerun=i % 2 == 0) == path.Clear(), case.case_id
        assert run_case(case=case, entry=entry, fast=True, rerun=i % 2 == 1, in_session=no_oracle).findings == ()
        judged += 1
    return judged


def test_our_torch_gather_is_clear_on_the_fast_path_over_8_drawn_cases_without_the_oracle():
    cases = _drawn(8, DEV)
    # The check declines none of the call-site views, a cache high in a larger one, or no rows.
    drawn = set().union(*(features(c.spec) for c in cases))
    assert {"view:dst-rows", "view:table-rows", "view:table-columns", "cache:high", "total==0"} <= drawn, drawn
    assert _clear_without_the_oracle("torch", cases) == 8


def test_a_run_of_both_scale_classes_on_the_fast_path_finds_nothing_in_our_torch_gather():
    entry = resolve("nvfp4_gather", "torch")
    for case in _drawn(2, DEV) + _drawn(2, DEV, Nvfp4Values.UNWRITTEN):
        assert run_case(case=case, entry=entry, fast=True, rerun=True).findings == (), case.case_id


@gpu
def test_on_the_gpu_our_cuda_gather_is_clear_on_the_fast_path_over_60_drawn_cases_with_no_fallback():
    assert _clear_without_the_oracle("cuda", _drawn(60, "cuda")) == 60


def _prepared(cases: list) -> list[tuple]:
    """Each case with its state, its guarded dst, the oracle's rows and two zeroed flags."""
    from mlafuzz.harness.fast.state import CaseState, Resources
    from mlafuzz.harness.memory.guards import PATTERNS

    def flags(case):
        return torch.zeros(2, dtype=torch.int64, device=case.device)

    return [
        (
            case,
            CaseState(case=case, res=Resources(), slots=flags(case)),
            OP.guarded(case, PATTERNS[0]),
            _oracle(case),
            flags(case),
        )
        for case in cases
    ]


def _prefill_and_check(work: list[tuple]) -> list[torch.Tensor]:
    """The path's adapters on each prepared case, its dst written with the oracle's rows between
    the prefill and the checks (of one run, and of two): the flags, unread."""
    from mlafuzz.harness.fast.nvfp4.gather import check, prefill

    for case, state, guards, want, flag in work:
        dst = guards["dst"].view
        assert prefill(case, guards, state)
        dst.copy_(want)
        assert check(case, {"dst": dst}, None, flag[:1], state)
        assert check(case, {"dst": dst}, {"dst": want}, flag[1:], state)
    return [flag for *_, flag in work]


def test_the_prefill_and_the_checks_read_nothing_back_to_the_host():
    from tests.support.syncs import counting

    work = _prepared(_drawn(4, DEV))
    with counting() as count:
        flags = _prefill_and_check(work)
    assert count.total == 0, dict(count.sites)
    assert not any(bool(f.any()) for f in flags)


@gpu
def test_on_the_gpu_the_prefill_and_the_checks_make_no_cuda_sync():
    import warnings

    from tests.support.syncs import cuda_syncs

    work = _prepared(_drawn(12, "cuda"))
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            flags = _prefill_and_check(work)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert cuda_syncs(seen) == 0
    assert not any(bool(f.any()) for f in flags)


def test_a_default_runs_nvfp4_gather_cases_meet_one_variant_of_the_check_and_of_its_map():
    """Nothing the case draws (row counts, views, a table's strides, seq_starts) and none of the
    check's modes (fill, one run, two runs) makes a new variant of the check or its map, each a
    compile in every worker of a cold run (the modes as constexprs made three)."""
    from tests.fast.test_variants import _by_kernel, _variants

    counts = _by_kernel(_variants("nvfp4_gather", range(100 * len(OPS.names))))
    assert counts["_rows"] == 1 and counts["_record_map"] == 1, counts


_PTX_SCRIPT = """
from mlafuzz.harness.fast.nvfp4.gather import LAYOUT, _rows
sig = {"cache8_ptr": "*u8", "rec_ptr": "*i64", "dst_bf16_ptr": "*bf16", "dst2_bf16_ptr": "*bf16",
       "bad_ptr": "*i64", "total": "i32", "dst_stride": "i32", "dst2_stride": "i32", "mode": "i32"}
flags = {"ROWS": 4, "USE_ASM": True, **LAYOUT}
triton.compile(
    ASTSource(fn=_rows, signature={**sig, **dict.fromkeys(flags, "constexpr")}, constexprs=flags),
    target=GPUTarget("cuda", 90, 32),
)
print("OK")
"""


@pytest.mark.slow
def test_the_gpu_build_of_the_check_with_every_mode_compiles_offline_for_sm90():
    from mlafuzz.tests.support.offline import compile_offline

    compile_offline(_PTX_SCRIPT)

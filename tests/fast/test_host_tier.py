"""Host-tier gather cases (SPEC 9.3) on the fast path: the fused check judges them itself.

A correct gather is Clear without the oracle running; each host-tier mutant is flagged by the
fused check (and the full path then names the mismatch); a call that writes the host cache or a
map is an input mutation; the row -> record map picks the oracle's tier per slot. On the CPU the
kernels run under Triton's interpreter (small shapes); on the GPU the same tests run compiled."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

from mlafuzz.generators.ops import gather as gen  # noqa: E402
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec, HostTier  # noqa: E402
from mlafuzz.generators.spec import Paging, ValueMode  # noqa: E402
from mlafuzz.harness.fast import path  # noqa: E402
from mlafuzz.harness.fast.gather import record_offsets  # noqa: E402
from mlafuzz.harness.ops.table import OPS  # noqa: E402
from mlafuzz.kernels import torch_impl  # noqa: E402
from mlafuzz.oracles import gather as og  # noqa: E402
from mlafuzz.reports.findings import Kind  # noqa: E402
from mlafuzz.tests.support.helpers import fast_verdict, materialize, resolve, run_case, session_with  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
MUTANTS = ("gather_host_choice_inverted", "gather_host_by_position", "gather_device_row0_absent")
MUTANTS += ("gather_host_tier_ignored",)


def _spec(host_pct: int, *, chunk: bool = False) -> GatherSpec:
    """Small host-tier calls: remapped device rows (row 0 among them), host rows no slot names,
    and as vLLM's HiSparse prefill calls it a chunk at a time (no seq_starts, [1, n] maps)."""
    requests = (
        GatherRequest(context_len=21, seq_start=0 if chunk else 4, length=17 if not chunk else 21),
        GatherRequest(context_len=0),
        GatherRequest(context_len=13),
    )
    return GatherSpec(
        requests=requests,
        paging=Paging(block_size=4, layout="shuffled"),
        values=ValueMode.ACTIVATIONS,
        ws_form="cumulative",
        pass_seq_starts=not chunk,
        host=HostTier(host_pct=host_pct, remap=True, extra_host_blocks=1, maps_2d=chunk),
    )


SPECS = [_spec(50), _spec(100), _spec(0), _spec(50, chunk=True)]


@pytest.mark.parametrize("spec", SPECS, ids=["mixed", "all-host", "no-host", "chunk-call"])
def test_a_correct_host_tier_gather_is_clear_on_the_fast_path_without_the_oracle(spec):
    case = materialize(spec, 3, DEV)
    assert path.fast_op(OPS.get("gather")).takes is None or path.fast_op(OPS.get("gather")).takes(case)
    assert fast_verdict(case, "torch") == path.Clear()
    assert fast_verdict(case, "torch", rerun=True) == path.Clear()  # the second run checked in the same pass

    def boom(case):
        raise AssertionError("the oracle ran although the fused check said the rows match")

    no_oracle = session_with("gather", oracle=boom)
    entry = no_oracle.entry("gather", "torch")
    assert run_case(case=case, entry=entry, fast=True, in_session=no_oracle).findings == ()


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_host_tier_mutant_is_flagged_by_the_fused_check_and_named_by_the_full_path(mutant):
    case = materialize(SPECS[0], 3, DEV)
    seen = fast_verdict(case, mutant)
    assert isinstance(seen, path.Undecided) and "fused check" in seen.seen, seen
    found = run_case(case=case, entry=resolve("gather", mutant), fast=True).findings
    assert Kind.VALUE_MISMATCH in {f.kind for f in found}, found


def _writes_its_inputs(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None, **host):
    torch_impl.gather_torch(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, **host)
    host["host_cache"][-1, 0] = 7  # a host row no slot reads: the rows stay right
    host["device_row_ids"].view(-1)[-1] = -3  # likewise a slot no row reads


def test_a_call_that_writes_the_host_cache_or_a_map_is_an_input_mutation_on_the_fast_path():
    case = materialize(SPECS[0], 3, DEV)
    assert case.tensors["host_cache"][-1, 0] != 7
    seen = fast_verdict(case, "torch", fn=_writes_its_inputs)
    assert isinstance(seen, path.Undecided) and "changed its input host_cache" in seen.seen, seen
    assert "changed its input device_row_ids" in seen.seen
    case = materialize(SPECS[0], 3, DEV)
    found = run_case(case=case, entry=resolve("gather", "torch"), fn=_writes_its_inputs, fast=True).findings
    assert {f.tensor for f in found if f.kind is Kind.INPUT_MUTATION} == {"host_cache", "device_row_ids"}, found


def test_a_gather_that_leaves_host_rows_unwritten_fails_the_one_run_write_map():
    case = materialize(SPECS[0], 3, DEV)

    def skips_host_rows(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None, **host):
        want = torch.empty_like(dst)
        torch_impl.gather_torch(src_cache, want, block_table, workspace_starts, batch_size, seq_starts, **host)
        rec = record_offsets(
            src_cache=src_cache,
            block_table=block_table,
            workspace_starts=workspace_starts,
            batch_size=batch_size,
            seq_starts=seq_starts,
            total=dst.shape[0],
            host_row_ids=host["host_row_ids"],
            device_row_ids=host["device_row_ids"],
        )
        dst[rec >= 0] = want[rec >= 0]

    seen = fast_verdict(case, "torch", fn=skips_host_rows)
    assert isinstance(seen, path.Undecided) and "fused check" in seen.seen, seen


@pytest.mark.parametrize("spec", SPECS, ids=["mixed", "all-host", "no-host", "chunk-call"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_row_to_record_map_picks_the_oracles_tier_for_every_row(spec, seed):
    case = materialize(dataclasses.replace(spec, paging=Paging(block_size=3, layout="shuffled")), seed, DEV)
    t, p = case.tensors, case.params
    args = dict(
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=p["batch_size"],
        seq_starts=t["seq_starts"],
        total=p["total"],
    )
    block, entry = og.row_records(block_size=3, device=t["src_cache"].device, **args)
    slot = block * 3 + entry
    d = t["device_row_ids"].reshape(-1).long()[slot]
    h = t["host_row_ids"].reshape(-1).long()[slot]
    want = torch.where(d >= 0, d * 656, -1 - h * 656)
    got = record_offsets(
        src_cache=t["src_cache"], host_row_ids=t["host_row_ids"], device_row_ids=t["device_row_ids"], **args
    )
    assert torch.equal(got, want)
    assert bool((d >= 0).any()) == (spec.host.host_pct < 100) and bool((d < 0).any()) == (spec.host.host_pct > 0)


def test_a_host_tier_given_in_part_or_with_maps_of_unequal_sizes_is_not_judged():
    from mlafuzz.harness.fast.gather import gather_rows_flag

    case = materialize(SPECS[0], 3, DEV)
    t = case.tensors
    tier = {k: t[k] for k in gen.HOST_ARGS}
    base = dict(
        block_table=t["block_table"],
        workspace_starts=t["workspace_starts"],
        batch_size=case.params["batch_size"],
        seq_starts=t["seq_starts"],
    )
    dst = og.gather(src_cache=t["src_cache"], total=case.params["total"], **base, **tier)
    base = dict(base, src_cache=t["src_cache"], dst=dst)
    flag = gather_rows_flag(**base, **tier)
    assert flag is not None and int(flag[0]) == 0
    assert gather_rows_flag(**base, host_cache=t["host_cache"], host_row_ids=t["host_row_ids"]) is None
    assert gather_rows_flag(**base, **dict(tier, host_row_ids=t["host_row_ids"].reshape(-1)[:-1])) is None
    assert int(gather_rows_flag(**base)[0]) != 0  # read from the device cache alone, the host rows differ


_PTX_SCRIPT = """
from mlafuzz.harness.fast.gather import _record_map, _rows
from mlafuzz.oracles.formats.table import get
FP8 = get("fp8_ds_mla")
i32 = "i32"
rows = {"cache8_ptr": "*u8", "host8_ptr": "*u8", "rec_ptr": "*i64", "dst_bf16_ptr": "*bf16",
        "dst2_bf16_ptr": "*bf16", "bad_ptr": "*i64", "total": i32, "dst_stride": i32, "dst2_stride": i32,
        "mode": i32}
for use_cvt in (False, True):
    flags = {"ROWS": 4, "USE_ASM": True, "USE_CVT": use_cvt,
             "SCALE_AT": FP8.plane("scale").offset, "ROPE_AT": FP8.plane("rope").offset}
    sig = {**rows, **dict.fromkeys(flags, "constexpr")}
    try:
        triton.compile(ASTSource(fn=_rows, signature=sig, constexprs=flags), target=GPUTarget("cuda", 90, 32))
    except ImportError as exc:
        print("SKIP", exc)
        sys.exit(0)
ptrs = dict.fromkeys(("ws_ptr", "ss_ptr", "table_ptr", "dmap_ptr", "hmap_ptr"), "*i32")
ints = dict.fromkeys(("total", "batch_size", "ws_stride", "ss_stride", "table_s0", "table_s1", "block_size",
                      "has_ss", "has_host"), i32)
flags = {"BLOCK": 1024, "RECORD_BYTES": FP8.record_bytes}
sig = {**ptrs, "out_ptr": "*i64", **ints, **dict.fromkeys(flags, "constexpr")}
triton.compile(ASTSource(fn=_record_map, signature=sig, constexprs=flags), target=GPUTarget("cuda", 90, 32))
print("OK")
"""


@pytest.mark.slow
def test_the_gpu_build_of_the_check_and_its_map_with_the_host_tier_as_a_runtime_branch_compiles_offline():
    from mlafuzz.tests.support.offline import compile_offline

    compile_offline(_PTX_SCRIPT)

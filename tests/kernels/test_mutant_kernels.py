"""The planted bugs of issues 16 and 17, each shown caught by run_case on the layout it needs.

SPEC 8's call-site layouts (a column-sliced block table, kv_c / k_pe as views
of one [T, 576] tensor, a cache past 2^32 bytes) are not drawn by the
generators yet, so these tests build them by hand: the mutant draws its kind,
the correct implementation is clean on the very same case, and on the plain
layout the fuzzer draws the mutant is clean too (why fuzzing cannot kill it
yet). The torch variants run here; the CUDA kernels (kernels/mutants/csrc/
mutants.cu) compile here and run in the gpu tests.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from mlafuzz.generators.case import Case
from mlafuzz.generators.invalid import with_
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.generators.spec import Layout, Paging
from mlafuzz.kernels import cuda_ext
from mlafuzz.kernels.mutants import cuda_mutants, host_throw
from mlafuzz.reports.findings import Kind
from mlafuzz.tests.support.helpers import materialize, resolve, run_case

GATHER = GatherSpec(
    requests=(
        GatherRequest(context_len=40, length=40),
        GatherRequest(context_len=50, seq_start=5, length=30),
        GatherRequest(context_len=33, length=33),
    ),
    paging=Paging(block_size=4, layout=Layout.SHUFFLED, spare_blocks=3),
)
WRITER = WriterSpec(num_tokens=12, paging=Paging(block_size=4, spare_blocks=2))
EXTRA_COLS = 5


def _kinds(case: Case, name: str, op: str) -> set[Kind]:
    return {f.kind for f in run_case(case=case, entry=resolve(op, name), rerun=True).findings}


def column_sliced_table(case: Case) -> Case:
    """The case with its block table a column slice of a wider table (row stride > width), as
    vLLM's call sites pass it; the extra columns hold other valid block ids."""
    table = case.tensors["block_table"]
    rows, width = table.shape
    num_blocks = case.tensors["src_cache"].shape[0]
    wide = torch.empty((rows, width + EXTRA_COLS), dtype=table.dtype, device=table.device)
    wide[:, :width] = table
    wide[:, width:] = torch.arange(rows * EXTRA_COLS, device=table.device).reshape(rows, EXTRA_COLS) % num_blocks
    view = wide[:, :width]
    assert view.stride(0) == width + EXTRA_COLS and torch.equal(view, table)
    return with_(case, tensors={"block_table": view})


def split_kv(case: Case) -> Case:
    """The case with kv_c and k_pe the two parts of one [T, 576] tensor (row stride 576, k_pe 1024
    bytes into each row), as vLLM's projection output is split."""
    kv_c, k_pe = case.tensors["kv_c"], case.tensors["k_pe"]
    both = torch.cat([kv_c, k_pe], dim=1)
    c, p = both.split([512, 64], dim=-1)
    assert c.stride(0) == 576 and p.storage_offset() == 512 and torch.equal(c, kv_c) and torch.equal(p, k_pe)
    return with_(case, tensors={"kv_c": c, "k_pe": p})


# ----------------------------------------------------------------------------- CPU: the torch variants


def test_contiguous_table_gather_reads_wrong_blocks_from_a_column_slice_and_torch_does_not():
    case = materialize(GATHER, 4)
    assert _kinds(case, "gather_contiguous_table", "gather") == set()  # the drawn layout hides the bug
    sliced = column_sliced_table(case)
    assert Kind.VALUE_MISMATCH in _kinds(sliced, "gather_contiguous_table", "gather")
    assert _kinds(sliced, "torch", "gather") == set()


def test_dst_storage_start_gather_writes_before_dst_into_its_guard_zone_and_torch_does_not():
    # The harness's dst is already a row slice: 4 KiB into a guarded buffer (harness/memory/guards.py).
    case = materialize(GATHER, 4)
    kinds = _kinds(case, "gather_dst_storage_start", "gather")
    assert kinds == {Kind.OOB_WRITE}  # its missing rows inside dst fold into the one misplaced-write finding
    assert _kinds(case, "torch", "gather") == set()


def test_contiguous_kv_c_writer_misreads_split_kv_c_and_k_pe_and_torch_does_not():
    case = materialize(WRITER, 6)
    assert _kinds(case, "writer_contiguous_kv_c", "writer") == set()  # the drawn layout hides the bug
    split = split_kv(case)
    assert Kind.VALUE_MISMATCH in _kinds(split, "writer_contiguous_kv_c", "writer")
    assert _kinds(split, "torch", "writer") == set()


def test_cpp_throw_gather_aborts_its_process_on_a_non_bf16_dst_and_is_ours_otherwise():
    if host_throw.compiler() is None:
        pytest.skip("no g++ on this machine")
    case = materialize(GATHER, 4)
    assert _kinds(case, "gather_cpp_throw", "gather") == set()
    script = textwrap.dedent("""
        import torch
        from mlafuzz.kernels.mutants.host_throw import gather_cpp_throw
        gather = gather_cpp_throw("cpu")
        cache = torch.zeros(2, 4, 656, dtype=torch.uint8)
        table, ws = torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        gather(cache, torch.empty(3, 576, dtype=torch.bfloat16), table, ws, 1)
        print("bf16 ran", flush=True)
        gather(cache, torch.empty(3, 576, dtype=torch.float32), table, ws, 1)
        print("float32 ran", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr)
    assert proc.stdout.splitlines() == ["bf16 ran"] and "dst must be bfloat16" in proc.stderr


def test_mutants_cu_bug_codes_are_the_ones_python_passes():
    text = cuda_mutants.SOURCE.read_text()
    snake = lambda name: re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()  # noqa: E731
    found = {
        (op.lower(), snake(name)): int(code)
        for op, name, code in re.findall(r"constexpr int64_t k(Gather|Writer)(\w+) = (\d+);", text)
    }
    expected = {
        **{("gather", k): v for k, v in cuda_mutants.GATHER_BUGS.items()},
        **{("writer", k): v for k, v in cuda_mutants.WRITER_BUGS.items()},
    }
    assert found == expected


@pytest.mark.slow
def test_mutants_cu_compiles_for_sm90_without_a_gpu(tmp_path):
    if cuda_ext._find_nvcc() is None:
        pytest.skip("nvcc not found: no CUDA toolkit on this machine (CI installs one)")
    data = cuda_mutants.nvcc_compile_check(out_dir=tmp_path).read_bytes()
    for kernel in (b"gather_mutant_kernel", b"writer_kernel"):
        assert kernel in data, kernel


# ----------------------------------------------------------------------------- GPU: the CUDA kernels


@pytest.fixture(scope="module")
def mutants_ext():
    info = cuda_mutants.load_extension()
    print(f"mutants extension: cold={info.cold} {info.seconds:.1f} s arch={info.arch} {info.path}")
    return info


@pytest.mark.gpu
def test_gpu_contiguous_table_kernel_reads_wrong_blocks_from_a_column_slice_and_ours_does_not(mutants_ext):
    case = materialize(GATHER, 4, "cuda")
    assert _kinds(case, "gather_contiguous_table", "gather") == set()
    sliced = column_sliced_table(case)
    assert Kind.VALUE_MISMATCH in _kinds(sliced, "gather_contiguous_table", "gather")
    assert _kinds(sliced, "cuda", "gather") == set()


@pytest.mark.gpu
def test_gpu_dst_storage_start_kernel_writes_into_the_guard_zone_before_dst_and_ours_does_not(mutants_ext):
    case = materialize(GATHER, 4, "cuda")
    assert Kind.OOB_WRITE in _kinds(case, "gather_dst_storage_start", "gather")
    assert _kinds(case, "cuda", "gather") == set()


@pytest.mark.gpu
def test_gpu_contiguous_kv_c_kernel_misreads_split_kv_c_and_k_pe_and_ours_does_not(mutants_ext):
    case = materialize(WRITER, 6, "cuda")
    assert _kinds(case, "writer_contiguous_kv_c", "writer") == set()
    split = split_kv(case)
    assert Kind.VALUE_MISMATCH in _kinds(split, "writer_contiguous_kv_c", "writer")
    assert _kinds(split, "cuda", "writer") == set()


# A cache past 2^32 bytes: 110,000 blocks of 64 records (4.6 GB). Blocks below LOW_LIMIT have byte
# offsets < 2^31 (right in int32 too); blocks from HIGH_FROM on have offsets in [2^32, 2^32 + 2^31),
# which an int32 offset wraps to another record inside the cache: a wrong value, never a fault.
# Blocks in between (offsets in [2^31, 2^32)) would point before the cache: none is used.
BIG_BS, BIG_BLOCKS = 64, 110_000
LOW_LIMIT = (1 << 31) // (BIG_BS * 656)  # 51,150
HIGH_FROM = (1 << 32) // (BIG_BS * 656) + 1  # 102,301


def huge_cache_case() -> Case:
    gen = torch.Generator(device="cuda").manual_seed(11)
    cache = torch.randint(0, 256, (BIG_BLOCKS, BIG_BS, 656), dtype=torch.uint8, device="cuda", generator=gen)
    low, high = [3, 20_000, LOW_LIMIT - 1], [HIGH_FROM, 105_555, BIG_BLOCKS - 1]
    table = torch.tensor([low, high], dtype=torch.int32, device="cuda")
    rows = 3 * BIG_BS
    spec = GatherSpec(requests=(GatherRequest(context_len=rows, length=rows),) * 2, paging=Paging(block_size=BIG_BS))
    tensors = {
        "src_cache": cache,
        "block_table": table,
        "workspace_starts": torch.tensor([0, rows], dtype=torch.int32, device="cuda"),
        "seq_starts": torch.zeros(2, dtype=torch.int32, device="cuda"),
    }
    return Case(
        op="gather", spec=spec, seed=11, device="cuda", tensors=tensors, params={"batch_size": 2, "total": 2 * rows}
    )


@pytest.mark.gpu
def test_gpu_int32_offset_kernel_reads_wrong_records_past_2_32_bytes_and_ours_does_not(mutants_ext):
    case = huge_cache_case()
    assert case.tensors["src_cache"].numel() > 1 << 32
    bad = run_case(case=case, entry=resolve("gather", "gather_int32_offset")).findings
    mismatch = [f for f in bad if f.kind is Kind.VALUE_MISMATCH]
    assert mismatch, [f.message for f in bad]
    # Only the second request (the blocks past 2^32 bytes) is wrong: rows 192..383.
    assert all(m.index[0] >= 3 * BIG_BS for f in mismatch for m in f.mismatches)
    assert run_case(case=case, entry=resolve("gather", "cuda")).findings == ()
    torch.cuda.synchronize()

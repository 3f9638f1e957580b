"""The fused generation room (generators/fused) makes a case's bytes exactly as the torch builders
do, for every op, value mode, top-k mode and view: switching it off, or deleting it, loses only
speed. On the CPU its kernels run under Triton's interpreter; on the GPU (where it is on by default)
the same comparison runs at realistic sizes."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.generators.draw import LARGE  # noqa: E402
from mlafuzz.generators.fused import SWITCH, kernels, room  # noqa: E402
from mlafuzz.generators.rng import batch, fill, topk  # noqa: E402
from mlafuzz.generators.rng.pool import Draws  # noqa: E402
from mlafuzz.tests.support.gen_cases import MEDIUM, differences, every_layout_spec  # noqa: E402
from mlafuzz.tests.support.helpers import draw_spec, materialize, specs  # noqa: E402
from mlafuzz.tests.support.offline import compile_offline  # noqa: E402

FUSED = ("block_table", "topk_indices", "convert_batch", "distinct_slots", "fill_records", "writer_rows")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launches(monkeypatch):
    """Counts the fused kernels' launches (so a comparison that never reached them fails)."""
    seen: collections.Counter[str] = collections.Counter()
    for name in FUSED:
        real = getattr(kernels, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)
    return seen


def _both(monkeypatch, spec, seed: int, device: str = DEV):
    monkeypatch.setenv(SWITCH, "0")
    torch_made = materialize(spec, seed, device)
    monkeypatch.setenv(SWITCH, "1")
    return torch_made, materialize(spec, seed, device)


# "low" meets every fused kernel in every mode and view; "high" the same past 300 zero blocks (25 s
# more under the interpreter): `-m slow`, and on a GPU with `-m gpu` too (test_on_cuda.py).
@pytest.mark.parametrize("base_block", [0, pytest.param(300, marks=pytest.mark.slow)], ids=["low", "high"])
def test_every_op_mode_and_view_is_the_same_bytes_fused_or_not(monkeypatch, launches, base_block):
    for i, spec in enumerate(every_layout_spec(base_block=base_block)):
        slow, fast = _both(monkeypatch, spec, 5 + i)
        assert differences(slow, fast) == [], spec
    assert set(launches) == set(FUSED)  # every kernel took part


def test_drawn_cases_at_the_large_presets_code_paths_are_the_same_bytes_fused_or_not(monkeypatch, launches):
    for op in ("convert", "gather", "writer", "step"):
        for i in range(6):
            slow, fast = _both(monkeypatch, draw_spec(op, seed=i, knobs=MEDIUM), i)
            assert differences(slow, fast) == [], (op, i)
    assert sum(launches.values()) > 24


@pytest.mark.parametrize("op", ("convert", "gather", "writer"))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=15, deadline=None)
def test_small_drawn_cases_are_the_same_bytes_fused_or_not(op, data, seed):
    spec = data.draw(specs(op))
    with pytest.MonkeyPatch.context() as mp:
        slow, fast = _both(mp, spec, seed)
    assert differences(slow, fast) == []


def test_a_stream_too_long_for_the_word_table_is_the_same_error_fused_or_not(monkeypatch):
    per_row = torch.ones(((1 << 18) + 1, 8), dtype=torch.int32)  # 4 words a row: one row too many
    call = lambda: topk.topk_indices(
        Draws(1, "t"), per_row=per_row, width=4, block_size=16, topk=32, mode="padded", device="cpu"
    )
    errors = []
    for switch in ("0", "1"):
        monkeypatch.setenv(SWITCH, switch)
        with pytest.raises(ValueError) as info:
            call()
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "at most" in errors[0]


def test_the_room_is_off_on_the_cpu_unless_asked_and_off_everywhere_when_switched_off(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    assert room("cpu") is None  # the interpreter is slower than torch: never by default
    monkeypatch.setenv(SWITCH, "0")
    assert room("cpu") is None and room("cuda") is None
    monkeypatch.setenv(SWITCH, "1")
    assert (room("cpu") is kernels) == kernels.INTERPRETED


@pytest.mark.gpu
@pytest.mark.parametrize("op", ("convert", "gather", "writer", "step"))
def test_large_cases_on_the_gpu_are_the_same_bytes_fused_or_not(monkeypatch, launches, op):
    monkeypatch.delenv(SWITCH, raising=False)
    assert room("cuda") is kernels  # on by default on a GPU
    for i in range(12):
        slow, fast = _both(monkeypatch, draw_spec(op, seed=100 + i, knobs=LARGE), i, "cuda")
        assert differences(slow, fast) == [], (op, i)
    assert sum(launches.values()) > 0


def test_without_the_room_every_case_is_still_made_by_the_torch_builders():
    # The room deleted (its import fails): the builders fall back, nothing else changes.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['mlafuzz.generators.fused'] = None\n"
        "from mlafuzz.generators.rng.fusing import fused_room\n"
        "from mlafuzz.tests.support.helpers import draw_spec, materialize\n"
        "assert fused_room('cuda') is None\n"
        "for op in ('convert', 'gather', 'writer', 'step'):\n"
        "    materialize(draw_spec(op, seed=3), 3, 'cpu')\n"
        "print('OK')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "OK", res.stderr


@pytest.mark.parametrize("num_slots", [1, 2, 3, 5, 64, 65, 1000, 8193])
def test_fused_slots_walk_the_same_keyed_permutation_as_the_torch_builder(monkeypatch, launches, num_slots):
    # n == num_slots: every value of the permutation, walks of up to ~20 steps (num_slots just past
    # a power of two) included; with padding and an offset past 2**31 (int64 slots).
    for padding, offset in ((False, 0), (True, 3 << 31)):
        made = []
        for switch in ("0", "1"):
            monkeypatch.setenv(SWITCH, switch)
            made.append(
                fill.distinct_slots(
                    Draws(num_slots, "s"), n=num_slots, num_slots=num_slots, padding=padding, offset=offset, device=DEV
                )
            )
        assert torch.equal(made[0], made[1]), (num_slots, padding)
    assert launches["distinct_slots"] == 2


@pytest.mark.parametrize(
    "tokens,before,after,layout",
    [
        ([3], 0, 0, "contiguous"),
        ([0, 4, 0, 0, 2, 1], 0, 0, "shuffled"),
        ([5, 0, 3], 7, 2, "shared_prefix"),
        ([0, 0, 1], 0, 5, "shuffled"),
        ([2] * 33, 3, 0, "contiguous"),
    ],
)
@pytest.mark.parametrize("workspace", [False, True], ids=["decode", "prefill"])
def test_a_fused_convert_batch_finds_each_rows_request_as_the_torch_builders(
    monkeypatch, launches, tokens, before, after, layout, workspace
):
    seq = np.array([(7 * i) % 50 for i in range(len(tokens))], dtype=np.int64)
    prefill = np.array([i % 2 for i in range(len(tokens))], dtype=np.int64) if workspace else None
    plan = fill.plan_table(need=(seq + 15) // 16, layout=layout, spare_blocks=3, extra_cols=1, base_block=9)
    made = []
    for switch in ("0", "1"):
        monkeypatch.setenv(SWITCH, switch)
        made.append(
            batch.convert_batch(
                Draws(len(tokens), "r"),
                plan,
                seq=seq,
                tokens=np.array(tokens, dtype=np.int64),
                prefill=prefill,
                before=before,
                after=after,
                block_size=16,
                topk=32,
                mode="mixed",
                device=DEV,
            )
        )
    slow, fused = made
    owners = fused.owners.tolist()
    assert owners[before : before + sum(tokens)] == [r for r, n in enumerate(tokens) for _ in range(n)]
    for name in ("table", "owners", "indices", "local_rows", "workspace_starts"):
        a, b = getattr(slow, name), getattr(fused, name)
        assert (
            (a is None and b is None)
            if not workspace and name in ("local_rows", "workspace_starts")
            else (torch.equal(a, b))
        ), name
    if workspace:  # the prefill requests (odd ones) are 0, 1, 2, ... in order; the others -1
        assert fused.local_rows.tolist() == [r // 2 if r % 2 else -1 for r in owners]
    assert launches["convert_batch"] == 1


@pytest.mark.gpu
def test_a_cached_launch_is_keyed_by_what_triton_specializes_and_makes_triton_launchs_bytes():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n", "add"])
    def add_kernel(dst_ptr, src_ptr, n, add, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n, other=0) + add, mask=i < n)

    launch = kernels._Launch(add_kernel)
    src = torch.arange(70, dtype=torch.int32, device="cuda")
    for offset in (0, 1, 0, 1, 4):  # 16-byte aligned, 4-byte aligned, ...: one variant each
        dst = torch.zeros(70, dtype=torch.int32, device="cuda")
        launch((1,), (dst[offset:], src[offset:]), (64, 7), BLOCK=64)
        assert dst[offset : offset + 64].tolist() == [v + 7 for v in range(offset, offset + 64)], offset
    assert len(launch._compiled) == 2
    dst = torch.zeros(70, dtype=torch.int32, device="cuda")
    launch((1,), (dst, src), (64, 2**33 + 3), BLOCK=64)  # an int64 value: Triton's own launch
    assert dst[:64].tolist() == [v + 3 for v in range(64)] and len(launch._compiled) == 2

    @triton.jit
    def loose_kernel(dst_ptr, n, BLOCK: tl.constexpr):
        tl.store(dst_ptr + tl.arange(0, BLOCK), n)

    with pytest.raises(TypeError, match="do_not_specialize"):  # a cached i32 variant could be wrong
        kernels._Launch(loose_kernel)((1,), (dst,), (5,), BLOCK=64)


_COMPILE_SCRIPT = """
from mlafuzz.generators.fused import kernels as K
I64 = {"offset"}  # int64 scalars
PTR = {  # the pointers that are not int32 (the kernels cast bytes and halves to int32 words themselves)
    (K._slots_kernel, "out_ptr"): "*i64",
    (K._records_kernel, "out_ptr"): "*u8",
    (K._records_kernel, "pool_ptr"): "*u8",
    (K._writer_kernel, "out_ptr"): "*bf16",
    (K._writer_kernel, "chunks_ptr"): "*bf16",
}
def sig(fn, consts):
    out = {}
    for p in fn.params:
        n = p.name
        if n in consts: out[n] = "constexpr"
        elif n.endswith("_ptr"): out[n] = PTR.get((fn, n), "*i32")
        elif n in I64: out[n] = "i64"
        else: out[n] = "i32"
    return out
# Every kernel is one variant: its flags (the pool permuted, cold columns, padding, the top-k mode,
# prefill rows, activations' scales) are runtime ints, so these are all a run compiles.
jobs = [
    (K._table_kernel, dict(TILE=1024)),
    (K._slots_kernel, dict(RB=1024)),
    (K._topk_kernel, dict(TILE=1024)),
    (K._batch_kernel, dict(TABLE_TILE=128, TILE=1024)),
    (K._records_kernel, dict(RB=16)),
    (K._writer_kernel, dict(RB=32)),
]
for fn, consts in jobs:
    # _Launch's cache keys an int only by its width: every int parameter must be unspecialized.
    loose = [p.name for p in fn.params if not p.is_constexpr and not p.name.endswith("_ptr") and not p.do_not_specialize]
    assert not loose, (fn.__name__, loose)
    triton.compile(ASTSource(fn=fn, signature=sig(fn, consts), constexprs=consts), target=GPUTarget("cuda", 90, 32))
print(len(jobs), "variants")
print("OK")
"""


def test_every_fused_kernel_variant_compiles_for_sm90_offline():
    # The interpreter runs the kernels' Python, not their GPU build: a construct the compiler
    # rejects (the walk's data-dependent loop, the binary search) must fail here, on the CPU.

    compile_offline(_COMPILE_SCRIPT)

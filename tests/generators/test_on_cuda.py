"""GPU: a case is the same bytes on the CPU and on CUDA, for every op, value mode and call-site view,
at the bottom of its cache or the top of a huge one: the contract that lets a bundle found on an H200
replay on a laptop."""

from __future__ import annotations

import pytest
import torch

from mlafuzz.generators.draw import LARGE
from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
from mlafuzz.generators.ops.writer import WriterSpec
from mlafuzz.generators.spec import Paging
from mlafuzz.tests.support.gen_cases import differences, every_layout_spec, raw
from mlafuzz.tests.support.helpers import draw_spec, materialize

SPECS = list(every_layout_spec()) + list(every_layout_spec(base_block=300))
HUGE = (1 << 32) // (64 * 656) + 1  # every record past 2**32 bytes


def _same_on_both(spec, seed: int) -> None:
    cpu, gpu = materialize(spec, seed, "cpu"), materialize(spec, seed, "cuda")
    # Every tensor on the GPU but the gather's host tier cache, which lives in pinned host memory.
    host = {k: t for k, t in gpu.tensors.items() if k == "host_cache" and t is not None}
    assert all(not t.is_cuda and (t.numel() == 0 or t.is_pinned()) for t in host.values())
    assert gpu.device.startswith("cuda") and all(
        t is None or t.is_cuda for k, t in gpu.tensors.items() if k not in host
    )
    if not cpu.zero_blocks:
        assert differences(cpu, gpu) == [], spec
        return
    # A cache with zero blocks: the blocks the case made, and zeros below them on the device.
    assert dict(cpu.zero_blocks) == dict(gpu.zero_blocks) and dict(cpu.params) == dict(gpu.params)
    a, b = cpu.generated_tensors(), gpu.generated_tensors()
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name].shape, a[name].stride()) == (b[name].shape, b[name].stride()), name
        assert torch.equal(raw(a[name]), raw(b[name])), name
    for name, n in gpu.zero_blocks.items():
        assert gpu.tensors[name].shape == cpu.tensors[name].shape and not bool(gpu.tensors[name][:n].any())


@pytest.mark.gpu
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.op}")
def test_every_op_value_mode_and_view_is_the_same_bytes_on_cpu_and_cuda(spec):
    _same_on_both(spec, 11)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ("convert", "gather", "writer", "step"))
def test_large_cases_are_the_same_bytes_on_cpu_and_cuda(op):
    for i in range(8):
        _same_on_both(draw_spec(op, seed=i, knobs=LARGE), i)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "spec",
    [
        GatherSpec(
            requests=(GatherRequest(context_len=9000, seq_start=4000, length=3000),),
            values="nan",
            paging=Paging(block_size=64, layout="shuffled", base_block=HUGE),
        ),
        WriterSpec(
            num_tokens=3000,
            values="extreme",
            padding=True,
            inputs_view="columns",
            paging=Paging(block_size=64, spare_blocks=3, base_block=HUGE),
        ),
    ],
    ids=["gather", "writer"],
)
def test_a_cache_past_2_32_bytes_is_the_same_bytes_on_cpu_and_cuda(spec):
    _same_on_both(spec, 5)
    case = materialize(spec, 5, "cuda")
    cache = next(case.tensors[n] for n in case.zero_blocks)
    assert cache.numel() > 1 << 32 and cache.is_cuda


@pytest.mark.gpu
def test_uploads_in_flight_are_never_overwritten_by_the_next_cases():
    # upload copies from pinned memory, asynchronously: many copies queued behind a long kernel,
    # no sync between them, must each land what it was given (a pinned block is reused only after
    # the copy that read it).
    from mlafuzz.generators.rng.fill import upload

    busy = torch.empty(1 << 26, device="cuda")
    parts = []
    for i in range(12):
        busy.mul_(1.0001)  # keep the stream busy, so the copies queue up
        parts.append(([i] * (50 + 1000 * i), upload([i] * (50 + 1000 * i), [(i, -i)] * 3, device="cuda")))
    for want, (flat, rows) in parts:
        assert flat.tolist() == want and rows.tolist() == [[want[0], -want[0]]] * 3

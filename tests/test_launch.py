"""oracles.launch: a kept compiled kernel is relaunched directly only for arguments Triton would
have compiled the same kernel for."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mlafuzz.oracles import launch as L  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _scaled_copy(src_ptr, dst_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0)
    tl.store(dst_ptr + offs, x * factor, mask=offs < n)


def _run(src: torch.Tensor, factor: int) -> torch.Tensor:
    dst = torch.zeros_like(src)
    L.launch(_scaled_copy, (triton.cdiv(src.numel(), 256),), src, dst, src.numel(), factor, BLOCK=256)
    return dst


def test_a_launch_gives_what_the_kernel_gives():
    src = torch.arange(1000, dtype=torch.int32, device=DEV)
    for factor in (3, 3, 1, 16):  # repeated: the second launch of a signature is the direct one on a GPU
        assert torch.equal(_run(src, factor), src * factor)


@pytest.mark.gpu
def test_a_signature_seen_before_is_launched_directly_and_a_new_one_compiles():
    src = torch.arange(4096, dtype=torch.int32, device=DEV)
    _run(src, 3)
    kept = len(L._KEPT)
    for factor in (5, 7, 9):  # the same signature: odd ints, neither 1 nor divisible by 16
        assert torch.equal(_run(src, factor), src * factor)
    assert len(L._KEPT) == kept
    assert torch.equal(_run(src, 32), src * 32)  # divisible by 16: Triton specializes on it
    assert len(L._KEPT) == kept + 1


@pytest.mark.gpu
def test_a_kernel_kept_for_aligned_tensors_is_never_reused_for_a_misaligned_one():
    """Triton vectorizes loads from pointers it knows are 16-byte aligned; reusing that kernel
    for an odd address would fault or read the wrong words."""
    base = torch.arange(4100, dtype=torch.int32, device=DEV)
    aligned = base[:4096]
    _run(aligned, 2)
    _run(aligned, 2)  # kept, then direct
    odd = base[1:4097]  # 4 bytes past an aligned address
    assert torch.equal(_run(odd, 2), odd * 2)
    torch.cuda.synchronize()

"""oracles.launch: a compiled kernel is reused only for arguments Triton would give the same variant."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")  # Triton kernels: without triton (an optional extra) this module skips

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from mlafuzz.harness.fast.launch import Launcher, arg_key  # noqa: E402


def test_keys_tell_apart_what_triton_specializes_on():
    base = torch.zeros(64, dtype=torch.int32)
    assert arg_key(base) != arg_key(base[1:])  # 16-byte aligned or not
    assert arg_key(base) != arg_key(base.view(torch.float32))  # dtype
    assert arg_key(base, specialized=False) == arg_key(base[1:], specialized=False)
    assert len({arg_key(v) for v in (1, 2, 16)}) == 3 and arg_key(2) == arg_key(17)  # == 1, multiple of 16, neither
    assert arg_key(2**31 - 1) != arg_key(2**31) and arg_key(-(2**31)) != arg_key(-(2**31) - 1)  # i32 / i64
    assert arg_key(2**31 - 1, specialized=False) != arg_key(2**31, specialized=False)
    assert arg_key(3, specialized=False) == arg_key(5, specialized=False)
    assert arg_key(True) != arg_key(1)


def _two_params(p, q, n, m, BLOCK):  # the parameters of a kernel, for Launcher.key
    pass


def test_a_launchers_key_follows_the_kernels_do_not_specialize_lists():
    base = torch.zeros(64, dtype=torch.int32)
    plain = Launcher(JITFunction(_two_params))
    loose = Launcher(JITFunction(_two_params, do_not_specialize=["n"], do_not_specialize_on_alignment=["q"]))
    for launch in (plain, loose):  # specialized on p's alignment and m's value either way
        assert launch.key((base, base, 16, 16)) != launch.key((base[1:], base, 16, 16))
        assert launch.key((base, base, 16, 16)) != launch.key((base, base, 16, 17))
        assert launch.key((base, base, 16, 16)) == launch.key((base[4:8], base, 16, 16))
    assert plain.key((base, base, 16, 2)) != plain.key((base, base[1:], 16, 2))
    assert plain.key((base, base, 16, 2)) != plain.key((base, base, 17, 2))
    assert loose.key((base, base, 16, 2)) == loose.key((base, base[1:], 17, 2))  # q, n: not specialized
    assert loose.key((base, base, 16, 2)) != loose.key((base, base, 2**31, 2))  # but n's width is


@triton.jit
def _scaled_copy(src_ptr, dst_ptr, n, mul, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=m) * mul, mask=m)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled launcher exists on the GPU only")
def test_direct_launches_match_tritons_own_for_every_alignment_and_int_class():
    """Each (alignment, n, mul) class gets its own compiled variant; the cached ones give what a
    fresh Triton launch gives, including on unaligned pointers and n == 1."""
    launch = Launcher(_scaled_copy)
    src = torch.arange(4096, dtype=torch.int32, device="cuda")
    for shift in (0, 1, 2, 4):
        for n in (1, 16, 17, 1000):
            for mul in (1, 3, 32):
                for _ in range(2):  # the second goes through the cached compiled kernel
                    s = src[shift : shift + n]
                    got = torch.full((n + shift,), -1, dtype=torch.int32, device="cuda")[shift:]
                    args = (s, got, n, mul)
                    launch(-(-n // 256), args, {"BLOCK": 256})
                    assert torch.equal(got, s * mul), (shift, n, mul)
    assert len(launch._kernels) > 1  # variants were told apart, not one reused for all
    assert all(hasattr(k, "packed_metadata") for k in launch._kernels.values())

"""Planted bugs in GPU kernels: build, load and call kernels/mutants/csrc/mutants.cu.

Each callable has the exact SPEC signature of its op and runs our kernel with one
named change (the table at the top of mutants.cu). The extension is built like
the product one (kernels/cuda_ext.py ``build_extension``: same exact flags,
cached by source, torch, CUDA and GPU arch) on the first call, never on import,
so listing the catalog builds nothing. Host checks are the product's
(kernels/checks.py): a mutant's bug is in its kernel or its launch, never in
what it refuses.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import torch

from mlafuzz.kernels import cuda_ext
from mlafuzz.kernels.checks import check_gather_args, check_writer_args
from mlafuzz.kernels.revisions import NEWEST, scale_rule

EXTENSION_NAME = "mlafuzz_mutants"
SOURCE = Path(__file__).parent / "csrc" / "mutants.cu"

# The `bug` codes of mutants.cu (kGather* / kWriter*).
GATHER_BUGS = {"int32_offset": 1, "contiguous_table": 2, "dst_storage_start": 3}
WRITER_BUGS = {"zero_grid": 1, "contiguous_kv_c": 2}


@functools.cache
def load_extension(*, verbose: bool = False) -> cuda_ext.BuildInfo:
    """Build (first time on this machine) and load the mutants' extension; cached per process."""
    return cuda_ext.build_extension(
        name=EXTENSION_NAME, sources=(SOURCE,), include_dirs=(cuda_ext.CSRC,), verbose=verbose
    )


def _ops():
    load_extension()
    return torch.ops.mlafuzz_mutants


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(torch.uint8) if cache.dtype != torch.uint8 and cache.element_size() == 1 else cache


def _require_cuda(name: str, t: torch.Tensor) -> None:
    if not (isinstance(t, torch.Tensor) and t.is_cuda):
        raise ValueError(f"{name} must be a CUDA tensor")


def gather(bug: str, *, revision: str | None = None) -> Callable[..., None]:
    """The gather of SPEC section 4 with planted ``bug`` (a key of GATHER_BUGS); ``revision`` is the
    writer's business, not the gather's (its dequant is the same under every revision)."""
    code = GATHER_BUGS[bug]

    def call(
        src_cache: torch.Tensor,
        dst: torch.Tensor,
        block_table: torch.Tensor,
        workspace_starts: torch.Tensor,
        batch_size: int,
        seq_starts: torch.Tensor | None = None,
    ) -> None:
        _require_cuda("src_cache", src_cache)
        check_gather_args(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
        _ops().gather(_bytes(src_cache), dst, block_table, workspace_starts, int(batch_size), seq_starts, code)

    call.__name__ = call.__qualname__ = f"gather_{bug}"
    return call


def writer(bug: str, *, revision: str | None = None) -> Callable[..., None]:
    """vLLM's concat_and_cache_mla for fp8_ds_mla (SPEC section 2) with planted ``bug`` (a key of
    WRITER_BUGS), writing the scale rule of ``revision`` (a pin) or of the keyword-only
    ``revision=`` the harness binds for the case (a revision-following entry), as our writer does."""
    code = WRITER_BUGS[bug]
    pinned = revision

    def call(
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str = "fp8_ds_mla",
        scale: torch.Tensor | None = None,
        *,
        revision: str = pinned or NEWEST,
    ) -> None:
        _require_cuda("kv_cache", kv_cache)
        check_writer_args(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)
        if slot_mapping.dtype != torch.int64:
            raise TypeError(f"slot_mapping.dtype={slot_mapping.dtype} must be torch.int64")
        _ops().writer(kv_c, k_pe, _bytes(kv_cache), slot_mapping, code, scale_rule(revision))

    call.__name__ = call.__qualname__ = f"writer_{bug}"
    return call


def nvcc_compile_check(*, out_dir: Path, arch: str = "sm_90") -> Path:
    """Compile mutants.cu to an object with nvcc and no GPU (CI), as cuda_ext's own check does."""
    (obj,) = cuda_ext.nvcc_compile_check(
        out_dir=out_dir, arch=arch, sources=(SOURCE,), name=EXTENSION_NAME, include_dirs=(cuda_ext.CSRC,)
    )
    return obj

"""Built-in registry entries: our kernels and the torch reference implementations.

Contracts name the error-input classes each promises to refuse (the
vocabulary of generators/ops/<op>.py's ``INVALID``). Mutants are listed in
kernels/mutants/catalog.py, the step pipeline in step_pipeline.py.
"""

from __future__ import annotations

from mlafuzz.kernels.checks import (
    CONVERT_REJECTS,
    DCP_PEER_REJECTS,
    DCP_REJECTS,
    GATHER_HOST_ARG_REJECTS,
    GATHER_TORCH_REJECTS,
    WRITER_TORCH_REJECTS,
)
from mlafuzz.kernels.entry import ImplEntry, module_attr
from mlafuzz.kernels.revisions import CONVERT_REVISIONS, FILTER_REVISIONS, WRITER_REVISIONS

# Our converts take both SPEC section 7 options and SPEC 9.2's caller-owned outputs (their signatures say so too: kernels/external.py).
CONVERT_OPTIONS = frozenset({"block_stride_rows", "compact_to_front", "caller_out"})
# ... and the arguments of vLLM's releases (SPEC 10): idx_mapping (0.33.0), the DCP arguments (0.30.0).
CONVERT_RELEASE_OPTIONS = CONVERT_OPTIONS | {"idx_mapping", "dcp_args"}
# Our writers follow either contract revision through their keyword-only ``revision=``.
FOLLOWS = frozenset(WRITER_REVISIONS)
# Our DCP filters follow every revision (their D == 1 hand-off asks ``convert_counted``), and take
# the filter's BLOCK_STRIDE_ROWS (vLLM 0.29.0).
DCP_FOLLOWS = frozenset(FILTER_REVISIONS)
DCP_OPTIONS = frozenset({"block_stride_rows"})
# Our writers take concat_and_cache_mla's skip_scale (vLLM 0.33.0); their signatures say so too.
WRITER_OPTIONS = frozenset({"seq_starts", "skip_scale"})
# Our converts follow every revision's convert_counted rule through their keyword-only ``revision=``
# (vLLM 0.30.0 compacts a counted row: revision 2026-11).
CONVERT_FOLLOWS = frozenset(CONVERT_REVISIONS)

# The CUDA kernels check on the host only what SPEC section 4 says vLLM checks, and the host tier's
# argument shapes, dtypes and devices (SPEC 9.3).
CUDA_GATHER_REJECTS = frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"}) | GATHER_HOST_ARG_REJECTS
# Our gathers take seq_starts and the host tier (SPEC 9.3); their signatures say so too.
GATHER_OPTIONS = frozenset({"seq_starts", "host_tier"})
# The nvfp4_ds_mla gather's: the fp8 gather's without the host tier (vLLM has none for nvfp4).
NVFP4_GATHER_TORCH_REJECTS = GATHER_TORCH_REJECTS - GATHER_HOST_ARG_REJECTS
CUDA_WRITER_REJECTS = frozenset({"wrong_dtype", "wrong_shape", "device_mismatch", "unsupported_kv_cache_dtype"})


def _entry(
    *,
    op: str,
    name: str,
    module: str,
    attr: str,
    devices: tuple[str, ...],
    rejects: frozenset[str],
    description: str,
    requires: tuple[str, ...] = (),
    capabilities: frozenset[str] = frozenset({"seq_starts"}),
    revisions: frozenset[str] | None = None,
    extension: bool = False,
) -> ImplEntry:
    return ImplEntry(
        op=op,
        name=name,
        loader=module_attr(module, attr),
        devices=frozenset(devices),
        rejects=rejects,
        description=description,
        requires=requires,
        capabilities=capabilities,
        revisions=revisions,
        extension=extension,
    )


BUILTINS: tuple[ImplEntry, ...] = (
    _entry(
        op="convert",
        name="triton",
        module="mlafuzz.kernels.triton_convert",
        attr="convert",
        devices=("cpu", "cuda"),
        rejects=CONVERT_REJECTS,
        requires=("triton",),
        capabilities=CONVERT_RELEASE_OPTIONS,
        revisions=CONVERT_FOLLOWS,
        description="our Triton kernel, one program per row (interpreted on CPU)",
    ),
    _entry(
        op="convert",
        name="torch",
        module="mlafuzz.kernels.torch_impl",
        attr="convert_torch",
        devices=("cpu", "cuda"),
        rejects=CONVERT_REJECTS,
        capabilities=CONVERT_RELEASE_OPTIONS,
        revisions=CONVERT_FOLLOWS,
        description="vectorized torch implementation",
    ),
    _entry(
        op="dcp",
        name="triton",
        module="mlafuzz.kernels.triton_convert",
        attr="filter_and_convert_dcp",
        devices=("cpu", "cuda"),
        rejects=DCP_REJECTS,
        requires=("triton",),
        capabilities=DCP_OPTIONS,
        revisions=DCP_FOLLOWS,
        description="our Triton convert kernel with DCP rank filtering",
    ),
    _entry(
        op="dcp",
        name="torch",
        module="mlafuzz.kernels.torch_impl",
        attr="filter_and_convert_dcp_torch",
        devices=("cpu", "cuda"),
        rejects=DCP_REJECTS,
        capabilities=DCP_OPTIONS,
        revisions=DCP_FOLLOWS,
        description="torch DCP rank filtering: local indices, then the torch convert",
    ),
    _entry(
        op="dcp_peer",
        name="torch",
        module="mlafuzz.kernels.torch_impl",
        attr="dcp_peer_slots_torch",
        devices=("cpu", "cuda"),
        rejects=DCP_PEER_REJECTS,
        capabilities=frozenset({"caller_out"}),
        description="torch DCP peer-slot map, caller-owned outputs",
    ),
    _entry(
        op="gather",
        name="torch",
        module="mlafuzz.kernels.torch_impl",
        attr="gather_torch",
        devices=("cpu", "cuda"),
        rejects=GATHER_TORCH_REJECTS,
        capabilities=GATHER_OPTIONS,
        description="vectorized torch implementation with host-side checks",
    ),
    _entry(
        op="gather",
        name="cuda",
        module="mlafuzz.kernels.cuda_ext",
        extension=True,
        attr="gather",
        devices=("cuda",),
        rejects=CUDA_GATHER_REJECTS,
        capabilities=GATHER_OPTIONS,
        description="our CUDA kernel: one warp per output row, 16-byte lanes",
    ),
    _entry(
        op="nvfp4_gather",
        name="torch",
        module="mlafuzz.kernels.nvfp4.torch_gather",
        attr="gather_nvfp4_torch",
        devices=("cpu", "cuda"),
        rejects=NVFP4_GATHER_TORCH_REJECTS,
        description="torch nvfp4_ds_mla upconvert gather (e2m1 table x e4m3 scale) with host-side checks",
    ),
    _entry(
        op="nvfp4_gather",
        name="cuda",
        module="mlafuzz.kernels.nvfp4.cuda_gather",
        extension=True,
        attr="gather",
        devices=("cuda",),
        rejects=frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"}),
        description="our CUDA nvfp4_ds_mla gather: one warp per row, e2m1 decoded on the bits (runs on Hopper)",
    ),
    _entry(
        op="nvfp4_writer",
        name="torch",
        module="mlafuzz.kernels.nvfp4.torch_writer",
        attr="writer_nvfp4_torch",
        devices=("cpu", "cuda"),
        rejects=WRITER_TORCH_REJECTS,
        description="torch nvfp4_ds_mla writer (concat_and_cache_mla signature), revision rn_bump.mul_recip",
    ),
    _entry(
        op="nvfp4_writer",
        name="triton",
        module="mlafuzz.kernels.nvfp4.triton_writer",
        attr="writer_nvfp4_triton",
        devices=("cpu", "cuda"),
        rejects=WRITER_TORCH_REJECTS,
        requires=("triton",),
        description="our Triton nvfp4_ds_mla writer, one program per token, revision rn_bump.mul_recip (exact division)",
    ),
    _entry(
        op="writer",
        name="torch",
        module="mlafuzz.kernels.torch_impl",
        attr="writer_torch",
        devices=("cpu", "cuda"),
        rejects=WRITER_TORCH_REJECTS,
        revisions=FOLLOWS,
        capabilities=WRITER_OPTIONS,
        description="torch fp8_ds_mla writer (concat_and_cache_mla signature), either revision",
    ),
    _entry(
        op="writer",
        name="cuda",
        module="mlafuzz.kernels.cuda_ext",
        extension=True,
        attr="writer",
        devices=("cuda",),
        rejects=CUDA_WRITER_REJECTS,
        revisions=FOLLOWS,
        capabilities=WRITER_OPTIONS,
        description="our CUDA fp8_ds_mla writer, either revision",
    ),
)

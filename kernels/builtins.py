"""Built-in registry entries: our kernels and the torch reference implementations.

Contracts name the invalid-input classes each promises to refuse (the
vocabulary of harness's error-input generator). Mutants register themselves in
kernels/mutants.py.
"""

from __future__ import annotations

from mlafuzz.kernels.registry import REGISTRY, register_builtin

# The CUDA kernels check on the host only what SPEC section 4 says vLLM checks.
CUDA_GATHER_REJECTS = frozenset({"wrong_dtype", "wrong_shape", "device_mismatch"})
CUDA_WRITER_REJECTS = frozenset({"wrong_dtype", "wrong_shape", "device_mismatch", "unsupported_kv_cache_dtype"})


def _register() -> None:
    if REGISTRY.get("convert", "triton") is not None:
        return
    from mlafuzz.kernels.checks import CONVERT_REJECTS, GATHER_TORCH_REJECTS, WRITER_TORCH_REJECTS

    register_builtin(op="convert", name="triton", module="mlafuzz.kernels.triton_convert", attr="convert",
                     devices=("cpu", "cuda"), rejects=CONVERT_REJECTS,
                     description="our Triton kernel, one program per row (interpreted on CPU)")
    register_builtin(op="convert", name="torch", module="mlafuzz.kernels.torch_impl", attr="convert_torch",
                     devices=("cpu", "cuda"), rejects=CONVERT_REJECTS,
                     description="vectorized torch implementation")
    register_builtin(op="gather", name="torch", module="mlafuzz.kernels.torch_impl", attr="gather_torch",
                     devices=("cpu", "cuda"), rejects=GATHER_TORCH_REJECTS,
                     description="vectorized torch implementation with host-side checks")
    register_builtin(op="gather", name="cuda", module="mlafuzz.kernels.cuda_ext", attr="gather",
                     devices=("cuda",), rejects=CUDA_GATHER_REJECTS,
                     description="our CUDA kernel: one warp per output row, 16-byte lanes")
    register_builtin(op="writer", name="torch", module="mlafuzz.kernels.torch_impl", attr="writer_torch",
                     devices=("cpu", "cuda"), rejects=WRITER_TORCH_REJECTS,
                     description="torch fp8_ds_mla writer (concat_and_cache_mla signature)")
    register_builtin(op="writer", name="cuda", module="mlafuzz.kernels.cuda_ext", attr="writer",
                     devices=("cuda",), rejects=CUDA_WRITER_REJECTS,
                     description="our CUDA fp8_ds_mla writer")
    import mlafuzz.kernels.mutants  # noqa: F401  (the planted-bug catalog registers itself)


_register()

import mlafuzz.kernels.step_pipeline  # noqa: E402,F401  (registers step=ours and the planted step bugs)

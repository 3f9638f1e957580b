"""Our kernels for the nvfp4_ds_mla cache format (352-byte records): the upconvert gather in torch
and CUDA, the writer in torch and Triton. Registered by kernels/builtins.py."""

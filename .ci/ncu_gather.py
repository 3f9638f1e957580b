"""Profile target for `bash .ci/gpu ncu`: the realistic gather (64 x 4096, bs 64) through each
rows-per-warp variant once, plus a Triton copy of the same byte count as the reference kernel
(torch's copy_ is a cudaMemcpy, which ncu does not profile)."""

import torch
import triton
import triton.language as tl

from mlafuzz.harness.bench.kernels import WORKLOADS
from mlafuzz.kernels import cuda_ext


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


impls = {f"rows{r}": (lambda *a, r=r: cuda_ext.gather_impl(*a, rows_per_warp=r)) for r in cuda_ext.GATHER_ROWS_CHOICES}
wl = WORKLOADS["gather"](impls)
for fn in wl.run.values():
    fn()
words = wl.nbytes // 2 // 8  # the gather's bytes, as a copy: half read, half written, in int64 words
src = torch.empty(2 * words, dtype=torch.int32, device="cuda").random_(0, 1 << 30).view(torch.int64)
dst = torch.empty_like(src)
n = src.numel()
_copy[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
torch.cuda.synchronize()

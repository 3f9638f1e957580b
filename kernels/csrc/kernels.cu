// mlafuzz: CUDA kernels for the fp8_ds_mla KV-cache record (SPEC.md sections 2 and 4), and the
// nvfp4_ds_mla gather (section 11).
//
//   gather  - cp_gather_and_upconvert with seq_starts: paged 656-byte records -> bf16 [total, 576]
//   writer  - concat_and_cache_mla for kv_cache_dtype "fp8_ds_mla" (both contract revisions, SPEC section 7)
//   nvfp4_gather - cp_gather_and_upconvert_nvfp4_kv_cache: paged 352-byte nvfp4_ds_mla records ->
//             bf16 [total, 576] (SPEC section 11; nvfp4_device.cuh)
//
// Design (gather, the bandwidth-bound one): one warp per output row, each warp one run of
// `rows_per_warp` (1/2/4/8) consecutive rows, all of a run's loads in flight before its first
// store; blocks of 4 warps, and a grid that covers every run (no persistent grid: on the H200 a
// one-wave grid-striding grid measured 0.87x of a copy, this one 0.92x, .ci/gather_lab.cu). The owner of a run's first row is found by
// a warp-cooperative 32-ary search over workspace_starts (one ballot round for B <= 32, two for
// B <= 1024); the rest of the run walks forward from it, reloading the block id only when the
// block changes. Each lane moves 8 codes per NoPE half with 8-byte loads and 16-byte stores
// (warp accesses of 256 and 512 contiguous bytes), its tile's scale as a broadcast 4-byte load,
// and lanes 0..7 the 128 RoPE bytes as 16-byte copies. A scalar kernel (byte loads, 2-byte stores, any strides)
// takes over when the cache or dst is not 16-byte aligned.
//
// Exactness: built WITHOUT fast math (-ftz=false -prec-div=true -fmad=false). The arithmetic is
// spelled with the IEEE intrinsics anyway (__fmul_rn, __fdiv_rn) so that no flag can contract or
// approximate it: one f32 multiply + one RNE rounding into bf16 per NoPE element (gather), one
// IEEE f32 division per scale and per code (writer). fp8 -> f32 goes through f16 (exact).
//
// This file holds the kernels and their launchers and includes no torch header; ops.cpp checks the
// tensors, fills the parameter blocks (params.h) and registers the torch ops (TORCH_LIBRARY,
// namespace mlafuzz_fp8_ds_mla, so that the .so needs no pybind11). The Python side is
// kernels/cuda_ext.py. Device-side preconditions are NOT checked (SPEC section 4: vLLM does not
// either); see the comments on gather_op / writer_op in ops.cpp.

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "params.h"          // constants, parameter blocks, the launchers' declarations
#include "gather_device.cuh"  // conversions, row -> record search, vector gather kernel
#include "writer_device.cuh"  // the writer kernel
#include "nvfp4_device.cuh"   // the nvfp4_ds_mla upconvert gather's kernels (SPEC 11)

namespace mlafuzz_ds_mla {

constexpr int kThreads = kWriterThreads;  // 8 warps per block (scalar gather, writer)
constexpr int kWarpsPerBlock = kThreads / kWarp;

// ---------------------------------------------------------------------------------------------
// gather, scalar path (the vector path is gather_vec_kernel in gather_device.cuh)
// ---------------------------------------------------------------------------------------------

// Scalar path for any alignment / strides: one warp per row, byte loads, 2-byte stores.
__global__ void __launch_bounds__(kThreads) gather_scalar_kernel(GatherParams p, uint16_t* __restrict__ dst,
                                                                 int64_t dst_row_stride,
                                                                 int64_t dst_col_stride) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t row = warp; row < p.total; row += num_warps) {
    const uint8_t* rec = locate_record(p, row, lane);
    if (rec == nullptr) continue;
    uint16_t* out = dst + row * dst_row_stride;
    for (int e = lane; e < kRowDim; e += kWarp) {
      uint16_t bits;
      if (e < kNopeDim) {
        const uint8_t* s = rec + kScaleOffset + 4 * (e / kTile);
        const uint32_t sbits = static_cast<uint32_t>(s[0]) | (static_cast<uint32_t>(s[1]) << 8) |
                               (static_cast<uint32_t>(s[2]) << 16) |
                               (static_cast<uint32_t>(s[3]) << 24);
        bits = static_cast<uint16_t>(dequant_bits(fp8_to_float(rec[e]), __uint_as_float(sbits)));
      } else {
        const uint8_t* r = rec + kRopeOffset + 2 * (e - kNopeDim);
        bits = static_cast<uint16_t>(r[0] | (r[1] << 8));
      }
      out[e * dst_col_stride] = bits;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers (called by ops.cpp, which has checked the tensors and made the device current)
// ---------------------------------------------------------------------------------------------

namespace {

// One warp per `rows_per_warp` items, capped at one wave of resident blocks: the kernels
// grid-stride, so a persistent grid keeps every warp busy to the end without a partial last wave
// (at 64 x 4096 rows a capped-at-a-few-waves grid would leave ~10% of the time in the tail).
template <typename Kernel>
cudaError_t grid_for(Kernel kernel, int64_t items, int rows_per_warp, int device, unsigned* grid) {
  int sms = 0;
  int per_sm = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (err != cudaSuccess) return err;
  const int64_t warps = (items + rows_per_warp - 1) / rows_per_warp;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t cap = static_cast<int64_t>(std::max(sms, 1)) * std::max(per_sm, 1);
  *grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
  return cudaSuccess;
}

// A grid covering every run of `rows` rows, one warp each, in blocks of kGatherThreads (the
// vector kernels still grid-stride, should it ever be capped).
unsigned grid_covering(int64_t total, int rows) {
  const int64_t runs = (total + rows - 1) / rows;
  const int64_t blocks = (runs + kGatherThreads / kWarp - 1) / (kGatherThreads / kWarp);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, INT32_MAX)));
}

}  // namespace

cudaError_t launch_gather(const GatherParams& p, const GatherDst& dst, bool vec, int rows_per_warp,
                          bool stream_hints, int device, cudaStream_t stream) {
  if (vec) {
    const int64_t row_bytes = dst.row_stride * 2;
    // One instantiation per (rows per warp, hints); see the bench's --variants for the sweep.
    const auto launch = [&](auto kernel, int rows) {
      kernel<<<grid_covering(p.total, rows), kGatherThreads, 0, stream>>>(p, dst.bytes, row_bytes);
    };
    switch (rows_per_warp * 2 + (stream_hints ? 1 : 0)) {
      case 2: launch(gather_vec_kernel<1, false>, 1); break;
      case 3: launch(gather_vec_kernel<1, true>, 1); break;
      case 4: launch(gather_vec_kernel<2, false>, 2); break;
      case 5: launch(gather_vec_kernel<2, true>, 2); break;
      case 8: launch(gather_vec_kernel<4, false>, 4); break;
      case 9: launch(gather_vec_kernel<4, true>, 4); break;
      case 16: launch(gather_vec_kernel<8, false>, 8); break;
      default: launch(gather_vec_kernel<8, true>, 8); break;
    }
  } else {
    unsigned grid = 0;
    const cudaError_t err = grid_for(gather_scalar_kernel, p.total, 1, device, &grid);
    if (err != cudaSuccess) return err;
    gather_scalar_kernel<<<grid, kThreads, 0, stream>>>(p, reinterpret_cast<uint16_t*>(dst.bytes), dst.row_stride,
                                                        dst.col_stride);
  }
  return cudaGetLastError();
}

cudaError_t launch_writer(const WriterParams& p, int device, cudaStream_t stream) {
  unsigned grid = 0;
  const cudaError_t err = grid_for(writer_kernel, p.num_tokens, 1, device, &grid);
  if (err != cudaSuccess) return err;
  writer_kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_nvfp4_gather(const GatherParams& p, const GatherDst& dst, bool vec, cudaStream_t stream) {
  if (vec) {
    constexpr int kRows = 2;  // as the fp8 gather's default (GATHER_ROWS_PER_WARP)
    nvfp4_gather_vec_kernel<kRows><<<grid_covering(p.total, kRows), kGatherThreads, 0, stream>>>(
        p, dst.bytes, dst.row_stride * 2);
  } else {
    nvfp4_gather_scalar_kernel<<<grid_covering(p.total, 1), kGatherThreads, 0, stream>>>(
        p, reinterpret_cast<uint16_t*>(dst.bytes), dst.row_stride, dst.col_stride);
  }
  return cudaGetLastError();
}

}  // namespace mlafuzz_ds_mla

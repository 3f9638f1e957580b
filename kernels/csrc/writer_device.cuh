// mlafuzz: the torch-free device half of the fp8_ds_mla writer (SPEC.md section 2, "Writer"):
// its parameters and kernel. Included by kernels.cu (the extension's kernels) and by
// kernels/mutants/csrc/mutants.cu (planted bugs whose change is on the host: the very same
// kernel, given other strides or another grid). Design and exactness notes: see the top of
// kernels.cu.

#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "gather_device.cuh"  // record layout constants, kWarp, kFullMask

namespace mlafuzz_ds_mla {

// 16-bit input element -> f32 (exact for both bf16 and fp16, subnormals included).
__device__ __forceinline__ float half_bits_to_float(uint16_t bits, bool is_fp16) {
  return is_fp16 ? __half2float(__ushort_as_half(bits))
                 : __bfloat162float(__ushort_as_bfloat16(bits));
}

// RoPE element -> stored 16-bit pattern. Default (SPEC section 2, vLLM, mlafuzz.oracles.codec): the
// 16-bit pattern of k_pe copied as is, whatever its dtype -- for an fp16 k_pe vLLM stores fp16
// bits that readers then take as bf16. With `convert` (opt-in, fp16 k_pe only) the fp16 value is
// rounded to bf16 instead (RNE; NaN -> 0x7FC0, what torch's CPU .to(torch.bfloat16) gives).
__device__ __forceinline__ uint32_t rope_bits(uint16_t bits, bool convert) {
  if (!convert) return bits;
  const float v = __half2float(__ushort_as_half(bits));
  if (v != v) return 0x7FC0u;
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// ---------------------------------------------------------------------------------------------
// writer (concat_and_cache_mla, fp8_ds_mla)
// ---------------------------------------------------------------------------------------------

// The stored scale of a tile with the given amax (never NaN: fmaxf dropped NaN elements).
// Revision 2026-07 (SPEC section 2): max(amax / 448, FLT_MIN), as is. Revision 2026-09 (SPEC
// section 7): s = max(amax / 448, 1e-4f), then the smallest power of two >= s, computed exactly
// on the bits rather than as exp2f(ceilf(log2f(s))): log2f may round onto an integer for an s a
// few ulps above a power of two, and the contract's rule is the exact one. s >= 1e-4f is normal,
// so a non-zero mantissa means "not a power of two": bump the exponent, clear the mantissa
// (exponent 254 + 1 gives inf, float32 overflow); inf keeps its bits.
__device__ __forceinline__ float tile_scale(float amax, bool pow2) {
  const float q = __fdiv_rn(amax, 448.0f);
  if (!pow2) return fmaxf(q, FLT_MIN);
  const uint32_t bits = __float_as_uint(fmaxf(q, 1e-4f));
  const uint32_t exp = bits & 0x7F800000u;
  const bool keep = (bits & 0x007FFFFFu) == 0u || exp == 0x7F800000u;
  return __uint_as_float(keep ? bits : exp + 0x00800000u);
}

__device__ __forceinline__ void store_u32(uint8_t* dst, uint32_t v, bool aligned) {
  if (aligned) {
    *reinterpret_cast<uint32_t*>(dst) = v;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

// One warp per token. Lane l handles, for NoPE half h (0, 1), elements [256h + 8l, +8): tile
// 2h + l/16, i.e. each tile is one 16-lane half-warp, reduced with xor shuffles of width < 16.
// The same element mapping as vLLM's kernel, so codes are written 8 bytes per lane.
__global__ void __launch_bounds__(kWriterThreads) writer_kernel(WriterParams p) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t t = warp; t < p.num_tokens; t += num_warps) {
    const int64_t slot = p.slot_mapping[t * p.slot_stride];
    if (slot < 0) continue;  // padding token: writes nothing
    const int64_t blk = slot / p.block_size;
    const int64_t off = slot % p.block_size;
    uint8_t* rec = p.cache + blk * p.cache_block_stride + off * p.cache_entry_stride;
    const uint16_t* x_row = p.kv_c + t * p.kv_c_row_stride;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e0 = 256 * h + 8 * lane;
      float x[8];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        x[i] = half_bits_to_float(x_row[(e0 + i) * p.kv_c_col_stride], p.kv_c_fp16);
        amax = fmaxf(amax, fabsf(x[i]));  // fmaxf drops a NaN operand
      }
#pragma unroll
      for (int m = 8; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, m));
      const float scale = tile_scale(amax, p.pow2_scale);
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t code =
            __nv_cvt_float_to_fp8(__fdiv_rn(x[i], scale), __NV_SATFINITE, __NV_E4M3);
        w[i / 4] |= code << (8 * (i % 4));
      }
      uint8_t* cdst = rec + e0;
      if (p.aligned8) {
        *reinterpret_cast<uint2*>(cdst) = make_uint2(w[0], w[1]);
      } else {
        store_u32(cdst, w[0], false);
        store_u32(cdst + 4, w[1], false);
      }
      if ((lane & 15) == 0) {
        store_u32(rec + kScaleOffset + 4 * (2 * h + lane / 16), __float_as_uint(scale), p.aligned8);
      }
    }
    // RoPE: 64 elements, two per lane, one 4-byte store per lane.
    const uint16_t* pe_row = p.k_pe + t * p.k_pe_row_stride;
    const uint32_t lo = rope_bits(pe_row[(2 * lane) * p.k_pe_col_stride], p.convert_rope);
    const uint32_t hi = rope_bits(pe_row[(2 * lane + 1) * p.k_pe_col_stride], p.convert_rope);
    store_u32(rec + kRopeOffset + 4 * lane, lo | (hi << 16), p.aligned8);
  }
}

}  // namespace mlafuzz_ds_mla

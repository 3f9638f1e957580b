// mlafuzz: the torch-free device half of the nvfp4_ds_mla upconvert gather (SPEC.md sections 4 and
// 11): vLLM 0.34.0's cp_gather_and_upconvert_nvfp4_kv_cache, 352-byte records -> bf16 [total, 576].
// Included by kernels.cu after gather_device.cuh, whose GatherParams and row -> record walk
// (locate_run / locate_record) it reuses: the addressing is the fp8 gather's, only the record differs.
//
// Record (SPEC 11.1): bytes [0, 256) 512 e2m1 codes, two per byte, the even element in the low
// nibble; [256, 320) 64 e4m3 RoPE values; [320, 352) 32 e4m3 scales, block s's (elements
// [16s, 16s + 16)) at byte 320 + 8 * (s & 3) + (s >> 2).
//
// Exactness: dst = bf16_rne(e2m1 * e4m3) computed as one f32 multiply (__fmul_rn): both factors are
// exact in f32 and the product has at most 6 significant bits, so it is exact, and so is its bf16
// rounding for every scale byte a writer emits (0x01..0x7E). The e2m1 decode is arithmetic on the
// bits (no SM100 cvt instruction), so it runs on Hopper.
//
// Memory: one warp per row, ROWS rows per warp with all their loads in flight first. Lane l holds
// scale block l: one 8-byte load of its 16 codes (a warp load of 256 contiguous bytes), one byte of
// its scale (the warp's 32 scale bytes are one sector), and two 16-byte stores of its 16 bf16 values
// (a warp store of 1024 contiguous bytes); lanes 0..7 widen 8 RoPE bytes each into one 16-byte store.

#pragma once

#include <cstdint>

#include "gather_device.cuh"

namespace mlafuzz_ds_mla {

// Byte of block s's scale inside the record (the 8x4 -> 4x8 transpose of SPEC 11.1).
__device__ __forceinline__ int nvfp4_scale_byte(int s) { return kNvfp4ScaleOffset + 8 * (s & 3) + (s >> 2); }

// e2m1 code (4 bits) -> f32, exact: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, sign bit 3 (code 8: -0).
// For m >= 2 the f32 has exponent (m >> 1) - 1 and one mantissa bit m & 1; m == 1 is 0.5.
__device__ __forceinline__ float e2m1_to_float(unsigned code) {
  const unsigned m = code & 7u;
  const unsigned mag = m >= 2u ? ((126u + (m >> 1)) << 23) | ((m & 1u) << 22) : (m ? 0x3F000000u : 0u);
  return __uint_as_float(mag | ((code & 8u) << 28));
}

// bf16 bits of e2m1(code) * scale.
__device__ __forceinline__ unsigned nvfp4_bits(unsigned code, float scale) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(e2m1_to_float(code), scale)));
}

// Four packed bytes (eight codes, low nibble first) -> eight bf16 (uint4).
__device__ __forceinline__ uint4 nvfp4_dequant8(unsigned packed, float scale) {
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned byte = (packed >> (8 * i)) & 0xffu;
    w[i] = nvfp4_bits(byte & 0xfu, scale) | (nvfp4_bits(byte >> 4, scale) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Four e4m3 bytes -> four bf16 (uint2), exact (e4m3 is a subset of bf16).
__device__ __forceinline__ uint2 e4m3x4_to_bf16(unsigned bytes) {
  const float2 a = fp8x2_to_float2(bytes);
  const float2 b = fp8x2_to_float2(bytes >> 16);
  const auto bits = [](float v) { return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(v))); };
  return make_uint2(bits(a.x) | (bits(a.y) << 16), bits(b.x) | (bits(b.y) << 16));
}

// Vector path (records 8-byte aligned, dst rows 16-byte aligned and contiguous): see the top.
template <int ROWS>
__global__ void __launch_bounds__(kGatherThreads) nvfp4_gather_vec_kernel(GatherParams p, uint8_t* __restrict__ dst,
                                                                         int64_t dst_row_stride_bytes) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int scale_byte = nvfp4_scale_byte(lane);
  for (int64_t base = warp * ROWS; base < p.total; base += num_warps * ROWS) {
    const uint8_t* rec[ROWS];
    locate_run<ROWS>(p, base, lane, rec);
    uint2 codes[ROWS];
    float scale[ROWS];
    uint2 rope[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (rec[r] != nullptr) {
        codes[r] = __ldg(reinterpret_cast<const uint2*>(rec[r] + 8 * lane));
        scale[r] = fp8_to_float(__ldg(rec[r] + scale_byte));
        if (lane < 8) rope[r] = __ldg(reinterpret_cast<const uint2*>(rec[r] + kNvfp4RopeOffset + 8 * lane));
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (rec[r] == nullptr) continue;
      uint8_t* out = dst + (base + r) * dst_row_stride_bytes;
      *reinterpret_cast<uint4*>(out + 32 * lane) = nvfp4_dequant8(codes[r].x, scale[r]);
      *reinterpret_cast<uint4*>(out + 32 * lane + 16) = nvfp4_dequant8(codes[r].y, scale[r]);
      if (lane < 8) {
        const uint2 lo = e4m3x4_to_bf16(rope[r].x);
        const uint2 hi = e4m3x4_to_bf16(rope[r].y);
        *reinterpret_cast<uint4*>(out + 2 * kNopeDim + 16 * lane) = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
  }
}

// Scalar path for any alignment and dst strides: one warp per row, byte loads, 2-byte stores.
__global__ void __launch_bounds__(kGatherThreads) nvfp4_gather_scalar_kernel(GatherParams p, uint16_t* __restrict__ dst,
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
      unsigned bits;
      if (e < kNopeDim) {
        const unsigned code = (rec[e >> 1] >> (4 * (e & 1))) & 0xfu;
        bits = nvfp4_bits(code, fp8_to_float(rec[nvfp4_scale_byte(e / kNvfp4Block)]));
      } else {
        bits = __bfloat16_as_ushort(__float2bfloat16_rn(fp8_to_float(rec[kNvfp4RopeOffset + e - kNopeDim])));
      }
      out[e * dst_col_stride] = static_cast<uint16_t>(bits);
    }
  }
}

}  // namespace mlafuzz_ds_mla

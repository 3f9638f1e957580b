// mlafuzz: the torch-free device half of the fp8_ds_mla gather (SPEC.md section 4): record layout
// constants, the exact conversions, the row -> record search and the vector gather kernel.
// Included by kernels.cu (the extension's kernels, with the writer) and by
// .ci/gather_lab.cu (the standalone bandwidth lab, no torch), so the lab measures this very code.
// Design and exactness notes: see the top of kernels.cu.

#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "params.h"  // record layout constants, GatherParams

namespace mlafuzz_ds_mla {

// The record layout's constants and GatherParams are in params.h (shared with the host half).

// ---------------------------------------------------------------------------------------------
// Exact element conversions
// ---------------------------------------------------------------------------------------------

// fp8 e4m3fn -> f32, exact for every code: e4m3 (incl. subnormals) is a subset of f16 and f16 of
// f32. On sm_89+ this is cvt.rn.f16x2.e4m3x2 + cvt.f32.f16; codes 0x7F/0xFF give NaN.
__device__ __forceinline__ float fp8_to_float(unsigned code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__ushort_as_half(h.x));
}

// Two codes (low byte first, i.e. lower address first) -> two f32.
__device__ __forceinline__ float2 fp8x2_to_float2(unsigned pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return make_float2(__half2float(__ushort_as_half(h.x)), __half2float(__ushort_as_half(h.y)));
}

// bf16_rne(f32(code) * scale), returned as the 16-bit pattern.
__device__ __forceinline__ unsigned dequant_bits(float value, float scale) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(value, scale)));
}

// Four codes packed little-endian in a 32-bit word -> two 32-bit words of two bf16 each.
__device__ __forceinline__ uint2 dequant4(unsigned codes, float scale) {
  const float2 a = fp8x2_to_float2(codes);
  const float2 b = fp8x2_to_float2(codes >> 16);
  uint2 out;
  out.x = dequant_bits(a.x, scale) | (dequant_bits(a.y, scale) << 16);
  out.y = dequant_bits(b.x, scale) | (dequant_bits(b.y, scale) << 16);
  return out;
}

// Eight codes (uint2) -> eight bf16 (uint4, 16 bytes).
__device__ __forceinline__ uint4 dequant8(uint2 codes, float scale) {
  const uint2 lo = dequant4(codes.x, scale);
  const uint2 hi = dequant4(codes.y, scale);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// ---------------------------------------------------------------------------------------------
// gather: row -> record
// ---------------------------------------------------------------------------------------------

// The record of source slot (block_id, off) under the host tier (see GatherParams). Warp-uniform.
__device__ __forceinline__ const uint8_t* tier_record(const GatherParams& p, int64_t block_id,
                                                      uint32_t off) {
  const int64_t slot = block_id * p.block_size + off;
  const int64_t d = __ldg(p.device_rows + slot);
  if (d >= 0) {
    const int64_t blk = d / p.block_size;
    return p.cache + blk * p.cache_block_stride + (d - blk * p.block_size) * p.cache_entry_stride;
  }
  return p.host_cache + static_cast<int64_t>(__ldg(p.host_rows + slot)) * kRecordBytes;
}

// Number of b in [0, B) with ws[b] <= row (= owning request + 1 for a valid ws).
// A warp-cooperative 32-ary search: each round every lane probes one evenly spaced entry and a
// ballot counts the probes <= row; for a non-decreasing ws they form a prefix, so one round
// narrows the interval 32-fold (B <= 32: one round, B <= 1024: two). Must be called by all 32
// lanes with the same row.
__device__ __forceinline__ int count_ws_le(const GatherParams& p, int64_t row, int lane) {
  int lo = 0;
  int n = p.batch_size;
  while (n > 0) {
    const int step = (n + kWarp - 1) / kWarp;
    const int off = lane * step;
    const bool probe = off < n && static_cast<int64_t>(__ldg(p.ws + (lo + off) * p.ws_stride)) <= row;
    const int k = __popc(__ballot_sync(kFullMask, probe));
    if (k == 0) break;
    const int last_le = lo + (k - 1) * step;  // known <= row
    const int remaining = n - (k - 1) * step - 1;
    lo = last_le + 1;
    n = min(step - 1, remaining);
  }
  return lo;
}

// Address of the record dst row `row` reads, or null when no request owns the row (row < ws[0]:
// a precondition violation; such rows are left untouched). Warp-uniform.
__device__ __forceinline__ const uint8_t* locate_record(const GatherParams& p, int64_t row,
                                                        int lane) {
  const int b = count_ws_le(p, row, lane) - 1;
  if (b < 0) return nullptr;
  const int64_t j = row - __ldg(p.ws + b * p.ws_stride);
  const int64_t start = p.seq_starts ? static_cast<int64_t>(__ldg(p.seq_starts + b * p.ss_stride)) : 0;
  // Positions are < 2^32 for any cache that fits in memory (pos / bs indexes the block table);
  // 32-bit unsigned division is several times cheaper than 64-bit and keeps ptxas from spilling.
  // A negative position (seq_starts < 0, a precondition violation) reads out of bounds.
  const uint32_t pos = static_cast<uint32_t>(start + j);
  const uint32_t ubs = static_cast<uint32_t>(p.block_size);
  const uint32_t blk = pos / ubs;
  const uint32_t off = pos - blk * ubs;
  const int64_t block_id =
      __ldg(p.block_table + b * p.bt_row_stride + static_cast<int64_t>(blk) * p.bt_col_stride);
  if (p.device_rows != nullptr) return tier_record(p, block_id, off);
  return p.cache + block_id * p.cache_block_stride + static_cast<int64_t>(off) * p.cache_entry_stride;
}

// Owners of the ROWS consecutive rows [base, base + ROWS): rec[r] is the record row base + r
// reads, or null (row >= total, or row < ws[0]). One 32-ary search for the first row, then a
// warp-uniform walk: the owner only moves forward over consecutive rows (past empty requests too),
// and the block id is reloaded only when the block changes (every block_size rows). So a run of
// rows costs one search plus about ROWS / block_size table loads instead of a search and a table
// load per row, which would sit on the critical path before every record load. For a valid ws
// (non-decreasing) the walk gives exactly the search's owner; for an invalid one it still stays
// in [-1, B).
template <int ROWS>
__device__ __forceinline__ void locate_run(const GatherParams& p, int64_t base, int lane,
                                           const uint8_t* (&rec)[ROWS]) {
  int b = count_ws_le(p, base, lane) - 1;
  const int last = p.batch_size - 1;
  int64_t next = (b < last) ? static_cast<int64_t>(__ldg(p.ws + (b + 1) * p.ws_stride)) : INT64_MAX;
  int64_t cur_ws = 0, start = 0;
  int cached_b = -1;
  uint32_t cached_blk = 0;
  const uint8_t* block_base = nullptr;
  int64_t block_id = 0;
  const uint32_t ubs = static_cast<uint32_t>(p.block_size);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t row = base + r;
    rec[r] = nullptr;
    if (row >= p.total) continue;
    while (row >= next) {  // a later request owns this row (skips empty ones)
      ++b;
      next = (b < last) ? static_cast<int64_t>(__ldg(p.ws + (b + 1) * p.ws_stride)) : INT64_MAX;
    }
    if (b < 0) continue;  // row < ws[0]: no owner, left untouched
    if (b != cached_b) {
      cur_ws = __ldg(p.ws + b * p.ws_stride);
      start = p.seq_starts ? static_cast<int64_t>(__ldg(p.seq_starts + b * p.ss_stride)) : 0;
    }
    // Positions are < 2^32 for any cache that fits in memory (pos / bs indexes the block table);
    // 32-bit unsigned division is several times cheaper than 64-bit and keeps ptxas from
    // spilling. A negative position (seq_starts < 0, a precondition violation) reads out of bounds.
    const uint32_t pos = static_cast<uint32_t>(start + (row - cur_ws));
    const uint32_t blk = pos / ubs;
    const uint32_t off = pos - blk * ubs;
    if (b != cached_b || blk != cached_blk) {
      block_id = __ldg(p.block_table + b * p.bt_row_stride + static_cast<int64_t>(blk) * p.bt_col_stride);
      block_base = p.cache + block_id * p.cache_block_stride;
      cached_b = b;
      cached_blk = blk;
    }
    // With the host tier every row looks its slot up in the maps (one more dependent load).
    rec[r] = p.device_rows != nullptr ? tier_record(p, block_id, off)
                                      : block_base + static_cast<int64_t>(off) * p.cache_entry_stride;
  }
}

// Loads and stores of the vector path, optionally with streaming cache hints (evict-first: the
// records are read once and dst is written once, so neither should push the other out of L2).
template <bool STREAM>
__device__ __forceinline__ uint2 load8(const uint8_t* ptr) {
  return STREAM ? __ldcs(reinterpret_cast<const uint2*>(ptr)) : __ldg(reinterpret_cast<const uint2*>(ptr));
}
template <bool STREAM>
__device__ __forceinline__ uint4 load16(const uint8_t* ptr) {
  return STREAM ? __ldcs(reinterpret_cast<const uint4*>(ptr)) : __ldg(reinterpret_cast<const uint4*>(ptr));
}
template <bool STREAM>
__device__ __forceinline__ void store16(uint8_t* ptr, uint4 v) {
  if (STREAM) {
    __stcs(reinterpret_cast<uint4*>(ptr), v);
  } else {
    *reinterpret_cast<uint4*>(ptr) = v;
  }
}

// Vector path: one warp per output row; each warp takes runs of ROWS consecutive rows (located
// together, see locate_run) and has all their loads in flight before the first store. Lane l of
// a row:
//   NoPE half h (0, 1): loads codes [256h + 8l, +8) as one 8-byte load (a warp load = 256
//   contiguous bytes), needs scale[2h + l/16] (one 4-byte load, broadcast in the half-warp),
//   writes bf16 [256h + 8l, +8) as one 16-byte store (a warp store = 512 contiguous bytes);
//   lanes 0..7 also copy one 16-byte RoPE chunk (record bytes 528 + 16l -> row bytes
//   1024 + 16l). Every global access is fully coalesced; 16-byte alignment of records and dst
//   rows is checked on the host.
template <int ROWS, bool STREAM>
__global__ void __launch_bounds__(kGatherThreads) gather_vec_kernel(GatherParams p, uint8_t* __restrict__ dst,
                                                              int64_t dst_row_stride_bytes) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int tile = lane >> 4;  // this lane's scale tile in each NoPE half
  for (int64_t base = warp * ROWS; base < p.total; base += num_warps * ROWS) {
    const uint8_t* rec[ROWS];
    locate_run<ROWS>(p, base, lane, rec);
    uint2 c0[ROWS], c1[ROWS];
    float s0[ROWS], s1[ROWS];
    uint4 rope[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (rec[r] != nullptr) {
        c0[r] = load8<STREAM>(rec[r] + 8 * lane);
        c1[r] = load8<STREAM>(rec[r] + 256 + 8 * lane);
        s0[r] = __ldg(reinterpret_cast<const float*>(rec[r] + kScaleOffset) + tile);
        s1[r] = __ldg(reinterpret_cast<const float*>(rec[r] + kScaleOffset) + 2 + tile);
        if (lane < 8) rope[r] = load16<STREAM>(rec[r] + kRopeOffset + 16 * lane);
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (rec[r] == nullptr) continue;
      uint8_t* out = dst + (base + r) * dst_row_stride_bytes;
      store16<STREAM>(out + 16 * lane, dequant8(c0[r], s0[r]));
      store16<STREAM>(out + 512 + 16 * lane, dequant8(c1[r], s1[r]));
      if (lane < 8) store16<STREAM>(out + 2 * kNopeDim + 16 * lane, rope[r]);
    }
  }
}

}  // namespace mlafuzz_ds_mla

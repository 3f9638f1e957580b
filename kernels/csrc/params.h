// mlafuzz: what the host and device halves of the CUDA extension share, in plain C++ (no device
// code, no torch): the record layouts' constants, the kernels' parameter blocks and the launchers
// that kernels.cu defines and ops.cpp calls.
//
// Why two translation units: torch's headers are most of a build's time (nvcc parses them twice,
// once for the host and once for the device, and compiles the host half through cudafe++). The
// kernels (kernels.cu) include none of them; the torch binding (ops.cpp) is plain C++ that g++
// compiles beside nvcc, so a cold build takes about the longer of the two instead of their sum.

#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace mlafuzz_ds_mla {

// fp8_ds_mla (SPEC section 2): 656-byte records -> bf16 rows of 576.
constexpr int kRecordBytes = 656;  // 41 x 16
constexpr int kNopeDim = 512;
constexpr int kRopeDim = 64;
constexpr int kRowDim = kNopeDim + kRopeDim;  // 576 bf16 = 1152 bytes = 72 x 16
constexpr int kScaleOffset = 512;             // 4 x f32, 16-byte aligned inside the record
constexpr int kRopeOffset = 528;              // 64 x bf16, 16-byte aligned inside the record
constexpr int kTile = 128;

// nvfp4_ds_mla (SPEC 11.1): 352-byte records, the same bf16 rows.
constexpr int kNvfp4RecordBytes = 352;  // 22 x 16
constexpr int kNvfp4RopeOffset = 256;
constexpr int kNvfp4ScaleOffset = 320;
constexpr int kNvfp4Block = 16;  // NoPE values per scale

constexpr int kWarp = 32;
constexpr int kGatherThreads = 128;  // 4 warps per block (vector gathers)
constexpr int kWriterThreads = 256;  // 8 warps per block (scalar gather, writer)
constexpr unsigned kFullMask = 0xffffffffu;

struct GatherParams {
  const uint8_t* cache;
  const int32_t* block_table;
  const int32_t* ws;
  const int32_t* seq_starts;  // may be null (= all zeros)
  int64_t total;
  int32_t batch_size;
  int32_t block_size;
  int64_t bt_row_stride, bt_col_stride;          // elements
  int64_t ws_stride, ss_stride;                  // elements
  int64_t cache_block_stride, cache_entry_stride;  // bytes
  // The host tier (SPEC 9.3, vLLM's HiSparse), all null without it: the source slot
  // s = block_id * block_size + offset is then an index into the two maps; its record is the device
  // cache's row device_rows[s] when that is >= 0 (any negative value means "on the host"), else
  // host_cache row host_rows[s] (pinned host memory, read in place through unified addressing;
  // rows are 656 contiguous bytes). Default-initialized so that every existing user of the struct
  // (the mutants, the bandwidth lab) keeps the plain path.
  const uint8_t* host_cache = nullptr;
  const int32_t* host_rows = nullptr;
  const int32_t* device_rows = nullptr;
};

struct WriterParams {
  const uint16_t* kv_c;
  const uint16_t* k_pe;
  uint8_t* cache;
  const int64_t* slot_mapping;
  int64_t num_tokens;
  int64_t kv_c_row_stride, kv_c_col_stride;  // elements
  int64_t k_pe_row_stride, k_pe_col_stride;  // elements
  int64_t slot_stride;                       // elements
  int64_t cache_block_stride, cache_entry_stride;  // bytes
  int32_t block_size;
  bool kv_c_fp16;
  bool pow2_scale;    // contract revision 2026-09: power-of-two tile scales (see tile_scale)
  bool convert_rope;  // fp16 k_pe rounded to bf16 instead of bit-copied (opt-in)
  bool aligned8;  // records 8-byte aligned: word stores, else byte stores
};

// Where a gather writes: bf16 rows of 576 at `bytes`, `row_stride` and `col_stride` in elements.
struct GatherDst {
  uint8_t* bytes;
  int64_t row_stride;
  int64_t col_stride;
};

// The launchers (kernels.cu). Each launches on `stream` of `device` (the caller has made it
// current) and returns cudaGetLastError() after the launch, or the first error before it. `vec`
// picks the vector kernel, whose alignment preconditions the caller has checked; otherwise the
// scalar one (any alignment and strides).
cudaError_t launch_gather(const GatherParams& p, const GatherDst& dst, bool vec, int rows_per_warp,
                          bool stream_hints, int device, cudaStream_t stream);
cudaError_t launch_writer(const WriterParams& p, int device, cudaStream_t stream);
cudaError_t launch_nvfp4_gather(const GatherParams& p, const GatherDst& dst, bool vec, cudaStream_t stream);

}  // namespace mlafuzz_ds_mla

// mlafuzz: CUDA kernels for the fp8_ds_mla KV-cache record (SPEC.md sections 2 and 4).
//
//   gather  - cp_gather_and_upconvert with seq_starts: paged 656-byte records -> bf16 [total, 576]
//   writer  - concat_and_cache_mla for kv_cache_dtype "fp8_ds_mla" (both contract revisions, SPEC section 7)
//   nvfp4_gather - cp_gather_and_upconvert_nvfp4_kv_cache: paged 352-byte nvfp4_ds_mla records ->
//             bf16 [total, 576] (SPEC section 11; nvfp4_device.cuh, nvfp4_host.cuh)
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
// Registered as torch ops (TORCH_LIBRARY, namespace mlafuzz_fp8_ds_mla) so that the .so needs no
// pybind11 and the translation unit stays light; the Python side is kernels/cuda_ext.py.
// Device-side preconditions are NOT checked (SPEC section 4: vLLM does not either); see the
// comments on gather_op / writer_op for what the host checks and what violations do.

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <optional>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "gather_device.cuh"  // constants, conversions, row -> record search, vector gather kernel
#include "writer_device.cuh"  // the writer kernel and its parameters
#include "nvfp4_device.cuh"  // the nvfp4_ds_mla upconvert gather's kernels (SPEC 11)

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
// Host side
// ---------------------------------------------------------------------------------------------

int sm_count(int device) {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n > 0 ? n : 1;
}

// One warp per `rows_per_warp` items, capped at one wave of resident blocks: the kernels
// grid-stride, so a persistent grid keeps every warp busy to the end without a partial last wave
// (at 64 x 4096 rows a capped-at-a-few-waves grid would leave ~10% of the time in the tail).
template <typename Kernel>
unsigned grid_for(Kernel kernel, int64_t items, int rows_per_warp, int device) {
  const int64_t warps = (items + rows_per_warp - 1) / rows_per_warp;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  const int64_t cap = static_cast<int64_t>(sm_count(device)) * std::max(per_sm, 1);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), name, " must be on ", ref.device(), ", got ", t.device());
}

// Host checks (cheap, shape/dtype/device only): src_cache uint8 [num_blocks, bs >= 1, 656] with a
// contiguous record dim; dst bf16 [total, 576]; block_table int32 2-D with >= batch_size rows;
// workspace_starts int32 1-D with >= batch_size entries; seq_starts int32 1-D with >= batch_size
// entries or None; all on one CUDA device; 0 <= batch_size < 2^31.
// Not checked (device-side preconditions, SPEC section 4): ws[0] == 0 (rows below ws[0] are left
// untouched), ws non-decreasing (the search then picks some request), ws[B-1] <= total, positions
// inside the block table (read out of bounds otherwise), block ids < num_blocks (likewise).
void gather_op(const at::Tensor& src_cache, const at::Tensor& dst, const at::Tensor& block_table,
               const at::Tensor& workspace_starts, int64_t batch_size,
               const std::optional<at::Tensor>& seq_starts, int64_t rows_per_warp,
               bool force_scalar, bool stream_hints, const std::optional<at::Tensor>& host_cache,
               const std::optional<at::Tensor>& host_row_ids,
               const std::optional<at::Tensor>& device_row_ids) {
  TORCH_CHECK(src_cache.is_cuda(), "gather: src_cache must be a CUDA tensor");
  TORCH_CHECK(src_cache.scalar_type() == at::kByte,
              "gather: src_cache must be uint8 (view an fp8 cache as uint8), got ",
              src_cache.scalar_type());
  TORCH_CHECK(src_cache.dim() == 3 && src_cache.size(2) == kRecordBytes,
              "gather: src_cache must be [num_blocks, block_size, 656], got ", src_cache.sizes());
  TORCH_CHECK(src_cache.stride(2) == 1,
              "gather: src_cache's record dim must be contiguous");
  TORCH_CHECK(src_cache.size(1) >= 1, "gather: block_size must be >= 1");
  TORCH_CHECK(dst.scalar_type() == at::kBFloat16, "gather: dst must be bfloat16, got ",
              dst.scalar_type());
  TORCH_CHECK(dst.dim() == 2 && dst.size(1) == kRowDim, "gather: dst must be [total, 576], got ",
              dst.sizes());
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2,
              "gather: block_table must be a 2-D int32 tensor");
  TORCH_CHECK(workspace_starts.scalar_type() == at::kInt && workspace_starts.dim() == 1,
              "gather: workspace_starts must be a 1-D int32 tensor");
  TORCH_CHECK(batch_size >= 0 && batch_size <= INT32_MAX, "gather: batch_size out of range: ",
              batch_size);
  TORCH_CHECK(workspace_starts.size(0) >= batch_size, "gather: workspace_starts has ",
              workspace_starts.size(0), " entries < batch_size ", batch_size);
  TORCH_CHECK(block_table.size(0) >= batch_size, "gather: block_table has ", block_table.size(0),
              " rows < batch_size ", batch_size);
  check_same_device(src_cache, dst, "gather: dst");
  check_same_device(src_cache, block_table, "gather: block_table");
  check_same_device(src_cache, workspace_starts, "gather: workspace_starts");
  const int32_t* ss_ptr = nullptr;
  int64_t ss_stride = 0;
  if (seq_starts.has_value()) {
    const at::Tensor& ss = *seq_starts;
    TORCH_CHECK(ss.scalar_type() == at::kInt && ss.dim() == 1,
                "gather: seq_starts must be a 1-D int32 tensor or None");
    TORCH_CHECK(ss.size(0) >= batch_size, "gather: seq_starts has ", ss.size(0),
                " entries < batch_size ", batch_size);
    check_same_device(src_cache, ss, "gather: seq_starts");
    ss_ptr = ss.data_ptr<int32_t>();
    ss_stride = ss.stride(0);
  }
  TORCH_CHECK(rows_per_warp == 1 || rows_per_warp == 2 || rows_per_warp == 4 || rows_per_warp == 8,
              "gather: rows_per_warp must be 1, 2, 4 or 8");
  // The host tier (SPEC 9.3): all three or none; host_cache pinned CPU uint8 [rows, 656]
  // contiguous; the maps int32, contiguous, equal in size, on src_cache's device. Not checked
  // (device-side preconditions): slots read < the maps' size, device rows < num_blocks * bs, host
  // rows in [0, rows) for the slots the host serves.
  const int given = host_cache.has_value() + host_row_ids.has_value() + device_row_ids.has_value();
  TORCH_CHECK(given == 0 || given == 3,
              "gather: host_cache, host_row_ids and device_row_ids go together or not at all");
  if (given == 3) {
    const at::Tensor& hc = *host_cache;
    const at::Tensor& hr = *host_row_ids;
    const at::Tensor& dr = *device_row_ids;
    TORCH_CHECK(hc.device().is_cpu() && (hc.numel() == 0 || hc.is_pinned()),
                "gather: host_cache must be pinned CPU memory");
    TORCH_CHECK(hc.scalar_type() == at::kByte && hc.dim() == 2 && hc.size(1) == kRecordBytes &&
                    hc.is_contiguous(),
                "gather: host_cache must be a contiguous uint8 [rows, 656] tensor");
    TORCH_CHECK(hr.scalar_type() == at::kInt && dr.scalar_type() == at::kInt,
                "gather: host_row_ids and device_row_ids must be int32");
    TORCH_CHECK(hr.is_contiguous() && dr.is_contiguous() && hr.numel() == dr.numel(),
                "gather: host_row_ids and device_row_ids must be contiguous and of equal size");
    check_same_device(src_cache, hr, "gather: host_row_ids");
    check_same_device(src_cache, dr, "gather: device_row_ids");
  }

  const int64_t total = dst.size(0);
  if (total == 0 || batch_size == 0) return;  // nothing to write; no launch

  GatherParams p;
  p.cache = src_cache.data_ptr<uint8_t>();
  p.block_table = block_table.data_ptr<int32_t>();
  p.ws = workspace_starts.data_ptr<int32_t>();
  p.seq_starts = ss_ptr;
  p.total = total;
  p.batch_size = static_cast<int32_t>(batch_size);
  p.block_size = static_cast<int32_t>(src_cache.size(1));
  p.bt_row_stride = block_table.stride(0);
  p.bt_col_stride = block_table.stride(1);
  p.ws_stride = workspace_starts.stride(0);
  p.ss_stride = ss_stride;
  p.cache_block_stride = src_cache.stride(0);
  p.cache_entry_stride = src_cache.stride(1);
  if (given == 3) {
    // Memory from cudaHostAlloc (torch's pinned allocator) has the same address on the device
    // under unified addressing (every 64-bit platform torch supports).
    p.host_cache = reinterpret_cast<const uint8_t*>(host_cache->data_ptr());
    p.host_rows = host_row_ids->data_ptr<int32_t>();
    p.device_rows = device_row_ids->data_ptr<int32_t>();
  }

  const c10::cuda::CUDAGuard guard(src_cache.device());
  const int device = src_cache.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  uint8_t* dst_bytes = reinterpret_cast<uint8_t*>(dst.data_ptr());
  const bool vec = !force_scalar && aligned16(p.cache) && p.cache_block_stride % 16 == 0 &&
                   p.cache_entry_stride % 16 == 0 && aligned16(dst_bytes) && dst.stride(1) == 1 &&
                   dst.stride(0) % 8 == 0 && (p.host_cache == nullptr || aligned16(p.host_cache));
  if (vec) {
    const int64_t row_bytes = dst.stride(0) * 2;
    const int rpw = static_cast<int>(rows_per_warp);
    // One instantiation per (rows per warp, hints); see the bench's --variants for the sweep.
    // A grid covering every run (the kernel still grid-strides, should it ever be capped).
    const auto launch = [&](auto kernel, int rows) {
      const int64_t runs = (total + rows - 1) / rows;
      const int64_t blocks = (runs + kGatherThreads / kWarp - 1) / (kGatherThreads / kWarp);
      const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, INT32_MAX)));
      kernel<<<grid, kGatherThreads, 0, stream>>>(p, dst_bytes, row_bytes);
    };
    switch (rpw * 2 + (stream_hints ? 1 : 0)) {
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
    const unsigned grid = grid_for(gather_scalar_kernel, total, 1, device);
    gather_scalar_kernel<<<grid, kThreads, 0, stream>>>(p, reinterpret_cast<uint16_t*>(dst_bytes),
                                                        dst.stride(0), dst.stride(1));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Host checks: kv_c [>= T, 512] and k_pe [>= T, 64], each bf16 or fp16 (any strides);
// kv_cache uint8 [num_blocks, bs >= 1, 656] with a contiguous record dim; slot_mapping int64 1-D
// [T]; one CUDA device. T = slot_mapping.size(0) (vLLM: inputs may carry CUDA-graph padding rows).
// kv_c and k_pe may differ in dtype. convert_fp16_rope: see rope_bits.
// Not checked: slots < num_blocks * bs (written out of bounds otherwise), duplicate slots (racy).
void writer_op(const at::Tensor& kv_c, const at::Tensor& k_pe, const at::Tensor& kv_cache,
               const at::Tensor& slot_mapping, bool convert_fp16_rope, int64_t scale_rule) {
  TORCH_CHECK(kv_cache.is_cuda(), "writer: kv_cache must be a CUDA tensor");
  TORCH_CHECK(kv_cache.scalar_type() == at::kByte,
              "writer: kv_cache must be uint8 (view an fp8 cache as uint8), got ",
              kv_cache.scalar_type());
  TORCH_CHECK(kv_cache.dim() == 3 && kv_cache.size(2) == kRecordBytes,
              "writer: kv_cache must be [num_blocks, block_size, 656], got ", kv_cache.sizes());
  TORCH_CHECK(kv_cache.stride(2) == 1, "writer: kv_cache's record dim must be contiguous");
  TORCH_CHECK(kv_cache.size(1) >= 1, "writer: block_size must be >= 1");
  const auto is_16bit = [](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  };
  TORCH_CHECK(is_16bit(kv_c) && kv_c.dim() == 2 && kv_c.size(1) == kNopeDim,
              "writer: kv_c must be bf16/fp16 [T, 512], got ", kv_c.scalar_type(), " ",
              kv_c.sizes());
  TORCH_CHECK(is_16bit(k_pe) && k_pe.dim() == 2 && k_pe.size(1) == kRopeDim,
              "writer: k_pe must be bf16/fp16 [T, 64], got ", k_pe.scalar_type(), " ",
              k_pe.sizes());
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1,
              "writer: slot_mapping must be a 1-D int64 tensor");
  const int64_t num_tokens = slot_mapping.size(0);
  TORCH_CHECK(kv_c.size(0) >= num_tokens && k_pe.size(0) >= num_tokens,
              "writer: kv_c/k_pe have fewer rows than slot_mapping (", kv_c.size(0), ", ",
              k_pe.size(0), " < ", num_tokens, ")");
  check_same_device(kv_cache, kv_c, "writer: kv_c");
  check_same_device(kv_cache, k_pe, "writer: k_pe");
  check_same_device(kv_cache, slot_mapping, "writer: slot_mapping");
  TORCH_CHECK(scale_rule == 0 || scale_rule == 1, "writer: scale_rule must be 0 (2026-07) or 1 (2026-09)");
  if (num_tokens == 0) return;

  WriterParams p;
  p.kv_c = reinterpret_cast<const uint16_t*>(kv_c.data_ptr());
  p.k_pe = reinterpret_cast<const uint16_t*>(k_pe.data_ptr());
  p.cache = kv_cache.data_ptr<uint8_t>();
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.num_tokens = num_tokens;
  p.kv_c_row_stride = kv_c.stride(0);
  p.kv_c_col_stride = kv_c.stride(1);
  p.k_pe_row_stride = k_pe.stride(0);
  p.k_pe_col_stride = k_pe.stride(1);
  p.slot_stride = slot_mapping.stride(0);
  p.cache_block_stride = kv_cache.stride(0);
  p.cache_entry_stride = kv_cache.stride(1);
  p.block_size = static_cast<int32_t>(kv_cache.size(1));
  p.kv_c_fp16 = kv_c.scalar_type() == at::kHalf;
  p.pow2_scale = scale_rule == 1;
  p.convert_rope = convert_fp16_rope && k_pe.scalar_type() == at::kHalf;
  p.aligned8 = (reinterpret_cast<uintptr_t>(p.cache) & 7u) == 0 && p.cache_block_stride % 8 == 0 &&
               p.cache_entry_stride % 8 == 0;

  const c10::cuda::CUDAGuard guard(kv_cache.device());
  const int device = kv_cache.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const unsigned grid = grid_for(writer_kernel, num_tokens, 1, device);
  writer_kernel<<<grid, kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace mlafuzz_ds_mla

#include "nvfp4_host.cuh"  // nvfp4_gather_op: its host checks and launch

TORCH_LIBRARY(mlafuzz_fp8_ds_mla, m) {
  m.def(
      "gather(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor workspace_starts, "
      "int batch_size, Tensor? seq_starts=None, int rows_per_warp=4, bool force_scalar=False, "
      "bool stream_hints=False, Tensor? host_cache=None, Tensor? host_row_ids=None, "
      "Tensor? device_row_ids=None) -> ()");
  m.def(
      "writer(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
      "bool convert_fp16_rope=False, int scale_rule=0) -> ()");
  m.def(
      "nvfp4_gather(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor workspace_starts, "
      "int batch_size, Tensor? seq_starts=None, bool force_scalar=False) -> ()");
}

TORCH_LIBRARY_IMPL(mlafuzz_fp8_ds_mla, CUDA, m) {
  m.impl("gather", &mlafuzz_ds_mla::gather_op);
  m.impl("writer", &mlafuzz_ds_mla::writer_op);
  m.impl("nvfp4_gather", &mlafuzz_ds_mla::nvfp4_gather_op);
}

// mlafuzz: the torch half of the CUDA extension (kernels/cuda_ext.py builds it with kernels.cu):
// each op's host checks, its parameter block (params.h) and its launcher call, and the ops'
// registration. Plain C++: no device code here, and kernels.cu includes no torch header (see
// params.h for why the two are apart).
//
// The Python wrappers check every argument before the op is called (an exception raised by
// TORCH_CHECK with an integer in its message was seen to crash the process on the H200 image), so
// these checks are a backstop.

#include <algorithm>
#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "params.h"

namespace mlafuzz_ds_mla {

namespace {

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), name, " must be on ", ref.device(), ", got ", t.device());
}

}  // namespace

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
  const GatherDst out{reinterpret_cast<uint8_t*>(dst.data_ptr()), dst.stride(0), dst.stride(1)};
  const bool vec = !force_scalar && aligned16(p.cache) && p.cache_block_stride % 16 == 0 &&
                   p.cache_entry_stride % 16 == 0 && aligned16(out.bytes) && dst.stride(1) == 1 &&
                   dst.stride(0) % 8 == 0 && (p.host_cache == nullptr || aligned16(p.host_cache));
  C10_CUDA_CHECK(launch_gather(p, out, vec, static_cast<int>(rows_per_warp), stream_hints, device, stream));
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
  C10_CUDA_CHECK(launch_writer(p, device, stream));
}


// Host checks (shape/dtype/device only), as the fp8 gather's: src_cache uint8 [num_blocks, bs >= 1,
// 352] with a contiguous record dim; dst bf16 [total, 576]; block_table int32 2-D with >= batch_size
// rows; workspace_starts (and seq_starts, when given) int32 1-D with >= batch_size entries; one CUDA
// device. Not checked (device-side preconditions, SPEC section 4, as vLLM): the ws order, ws past
// dst, positions inside the table, block ids inside the cache.
void nvfp4_gather_op(const at::Tensor& src_cache, const at::Tensor& dst, const at::Tensor& block_table,
                     const at::Tensor& workspace_starts, int64_t batch_size,
                     const std::optional<at::Tensor>& seq_starts, bool force_scalar) {
  TORCH_CHECK(src_cache.is_cuda() && src_cache.scalar_type() == at::kByte,
              "nvfp4_gather: src_cache must be a CUDA uint8 tensor");
  TORCH_CHECK(src_cache.dim() == 3 && src_cache.size(2) == kNvfp4RecordBytes && src_cache.stride(2) == 1 &&
                  src_cache.size(1) >= 1,
              "nvfp4_gather: src_cache must be [num_blocks, block_size >= 1, 352], record dim contiguous");
  TORCH_CHECK(dst.scalar_type() == at::kBFloat16 && dst.dim() == 2 && dst.size(1) == kRowDim,
              "nvfp4_gather: dst must be bfloat16 [total, 576]");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2,
              "nvfp4_gather: block_table must be a 2-D int32 tensor");
  TORCH_CHECK(workspace_starts.scalar_type() == at::kInt && workspace_starts.dim() == 1,
              "nvfp4_gather: workspace_starts must be a 1-D int32 tensor");
  TORCH_CHECK(batch_size >= 0 && batch_size <= INT32_MAX && workspace_starts.size(0) >= batch_size &&
                  block_table.size(0) >= batch_size,
              "nvfp4_gather: batch_size out of range or above workspace_starts / block_table's rows");
  check_same_device(src_cache, dst, "nvfp4_gather: dst");
  check_same_device(src_cache, block_table, "nvfp4_gather: block_table");
  check_same_device(src_cache, workspace_starts, "nvfp4_gather: workspace_starts");
  GatherParams p;
  p.seq_starts = nullptr;
  p.ss_stride = 0;
  if (seq_starts.has_value()) {
    const at::Tensor& ss = *seq_starts;
    TORCH_CHECK(ss.scalar_type() == at::kInt && ss.dim() == 1 && ss.size(0) >= batch_size,
                "nvfp4_gather: seq_starts must be a 1-D int32 tensor of >= batch_size entries, or None");
    check_same_device(src_cache, ss, "nvfp4_gather: seq_starts");
    p.seq_starts = ss.data_ptr<int32_t>();
    p.ss_stride = ss.stride(0);
  }
  const int64_t total = dst.size(0);
  if (total == 0 || batch_size == 0) return;  // nothing to write; no launch

  p.cache = src_cache.data_ptr<uint8_t>();
  p.block_table = block_table.data_ptr<int32_t>();
  p.ws = workspace_starts.data_ptr<int32_t>();
  p.total = total;
  p.batch_size = static_cast<int32_t>(batch_size);
  p.block_size = static_cast<int32_t>(src_cache.size(1));
  p.bt_row_stride = block_table.stride(0);
  p.bt_col_stride = block_table.stride(1);
  p.ws_stride = workspace_starts.stride(0);
  p.cache_block_stride = src_cache.stride(0);
  p.cache_entry_stride = src_cache.stride(1);

  const c10::cuda::CUDAGuard guard(src_cache.device());
  const int device = src_cache.get_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const GatherDst out{reinterpret_cast<uint8_t*>(dst.data_ptr()), dst.stride(0), dst.stride(1)};
  const bool vec = !force_scalar && (reinterpret_cast<uintptr_t>(p.cache) & 7u) == 0 &&
                   p.cache_block_stride % 8 == 0 && p.cache_entry_stride % 8 == 0 && aligned16(out.bytes) &&
                   dst.stride(1) == 1 && dst.stride(0) % 8 == 0;
  C10_CUDA_CHECK(launch_nvfp4_gather(p, out, vec, stream));
}


}  // namespace mlafuzz_ds_mla

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

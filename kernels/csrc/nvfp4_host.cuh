// mlafuzz: the host half of the nvfp4_ds_mla upconvert gather (nvfp4_device.cuh). Included by
// fp8_ds_mla.cu after its host helpers (grid_for, aligned16, check_same_device), so the one
// extension holds every kernel of ours.
//
// Host checks (shape/dtype/device only), as the fp8 gather's: src_cache uint8 [num_blocks, bs >= 1,
// 352] with a contiguous record dim; dst bf16 [total, 576]; block_table int32 2-D with >= batch_size
// rows; workspace_starts (and seq_starts, when given) int32 1-D with >= batch_size entries; one CUDA
// device. Not checked (device-side preconditions, SPEC section 4, as vLLM): the ws order, ws past
// dst, positions inside the table, block ids inside the cache.

#pragma once

namespace mlafuzz_ds_mla {

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
  uint8_t* dst_bytes = reinterpret_cast<uint8_t*>(dst.data_ptr());
  const bool vec = !force_scalar && (reinterpret_cast<uintptr_t>(p.cache) & 7u) == 0 &&
                   p.cache_block_stride % 8 == 0 && p.cache_entry_stride % 8 == 0 && aligned16(dst_bytes) &&
                   dst.stride(1) == 1 && dst.stride(0) % 8 == 0;
  if (vec) {
    constexpr int kRows = 2;  // as the fp8 gather's default (GATHER_ROWS_PER_WARP)
    const int64_t runs = (total + kRows - 1) / kRows;
    const int64_t blocks = (runs + kGatherThreads / kWarp - 1) / (kGatherThreads / kWarp);
    const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, INT32_MAX)));
    nvfp4_gather_vec_kernel<kRows><<<grid, kGatherThreads, 0, stream>>>(p, dst_bytes, dst.stride(0) * 2);
  } else {
    const int64_t blocks = (total + kGatherThreads / kWarp - 1) / (kGatherThreads / kWarp);
    const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, INT32_MAX)));
    nvfp4_gather_scalar_kernel<<<grid, kGatherThreads, 0, stream>>>(p, reinterpret_cast<uint16_t*>(dst_bytes),
                                                                    dst.stride(0), dst.stride(1));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace mlafuzz_ds_mla

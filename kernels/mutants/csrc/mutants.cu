// mlafuzz: planted bugs in GPU kernels (the catalog is kernels/mutants/catalog.py; the Python side
// is kernels/mutants/cuda_mutants.py). Each is our kernel -- the gather's device half
// (kernels/csrc/gather_device.cuh) or the writer's (writer_device.cuh) -- with ONE named change,
// selected by the op's `bug` argument. The product extension (kernels/csrc/kernels.cu) holds
// none of this code.
//
//   gather bugs                                                   what the harness should see
//   1 int32_offset       record byte offset block * block_stride + off * entry_stride
//                        computed in 32-bit arithmetic (wraps once it passes 2^31)   VALUE_MISMATCH
//   2 contiguous_table   block_table indexed as b * width + blk: its row stride assumed
//                        to be its width (vLLM passes column slices of a wider table) VALUE_MISMATCH
//   3 dst_storage_start  rows written from dst's storage start, not its data pointer
//                        (a row slice of a workspace writes the rows before it)      OOB_WRITE
//   writer bugs
//   1 zero_grid          num_tokens == 0 launches the kernel with a zero-size grid and
//                        the launch is never checked (the error stays pending)       LAUNCH_ERROR
//   2 contiguous_kv_c    kv_c / k_pe read as contiguous [T, 512] / [T, 64]: their row
//                        strides ignored (vLLM's are views of one [T, 576] tensor)   VALUE_MISMATCH
//
// The host checks are Python's (kernels/checks.py, as for the product kernels); the C++ ones here
// are a backstop and format no integers (see kernels/cuda_ext.py on TORCH_CHECK messages).

#include <cstdint>
#include <optional>

#include <cuda_runtime.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "gather_device.cuh"  // GatherParams, count_ws_le, the exact conversions
#include "writer_device.cuh"  // WriterParams, writer_kernel

namespace mlafuzz_mutants {

using namespace mlafuzz_ds_mla;

constexpr int64_t kGatherInt32Offset = 1;
constexpr int64_t kGatherContiguousTable = 2;
constexpr int64_t kGatherDstStorageStart = 3;
constexpr int64_t kWriterZeroGrid = 1;
constexpr int64_t kWriterContiguousKvC = 2;

constexpr int kThreads = kWriterThreads;  // 8 warps per block
constexpr int kWarpsPerBlock = kThreads / kWarp;

// locate_record (gather_device.cuh) with the gather bugs that live on the device planted in it.
__device__ __forceinline__ const uint8_t* mutant_record(const GatherParams& p, int64_t row, int lane,
                                                        int64_t table_width, int64_t bug) {
  const int b = count_ws_le(p, row, lane) - 1;
  if (b < 0) return nullptr;
  const int64_t j = row - p.ws[b * p.ws_stride];
  const int64_t start = p.seq_starts ? static_cast<int64_t>(p.seq_starts[b * p.ss_stride]) : 0;
  const int64_t pos = start + j;
  const int64_t blk = pos / p.block_size;
  const int64_t off = pos - blk * p.block_size;
  const int64_t entry = bug == kGatherContiguousTable
                            ? b * table_width + blk  // THE BUG: row stride taken to be the width
                            : b * p.bt_row_stride + blk * p.bt_col_stride;
  const int64_t block_id = p.block_table[entry];
  if (bug == kGatherInt32Offset) {
    // THE BUG: the byte offset in 32 bits. Unsigned arithmetic wraps mod 2^32 (no UB), and the
    // int32 it is then taken as is negative from 2^31 on: offsets in [2^31, 2^32) point before
    // the cache, offsets in [2^32, 2^32 + 2^31) at the wrong record inside a cache that large.
    const uint32_t wrapped = static_cast<uint32_t>(block_id) * static_cast<uint32_t>(p.cache_block_stride) +
                             static_cast<uint32_t>(off) * static_cast<uint32_t>(p.cache_entry_stride);
    return p.cache + static_cast<int64_t>(static_cast<int32_t>(wrapped));
  }
  return p.cache + block_id * p.cache_block_stride + off * p.cache_entry_stride;
}

// The scalar gather (any alignment, any strides): one warp per row, byte loads, 2-byte stores.
__global__ void __launch_bounds__(kThreads) gather_mutant_kernel(GatherParams p, uint16_t* __restrict__ dst,
                                                                 int64_t dst_row_stride, int64_t dst_col_stride,
                                                                 int64_t table_width, int64_t bug) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t row = warp; row < p.total; row += num_warps) {
    const uint8_t* rec = mutant_record(p, row, lane, table_width, bug);
    if (rec == nullptr) continue;
    uint16_t* out = dst + row * dst_row_stride;
    for (int e = lane; e < kRowDim; e += kWarp) {
      uint16_t bits;
      if (e < kNopeDim) {
        const uint8_t* s = rec + kScaleOffset + 4 * (e / kTile);
        const uint32_t sbits = static_cast<uint32_t>(s[0]) | (static_cast<uint32_t>(s[1]) << 8) |
                               (static_cast<uint32_t>(s[2]) << 16) | (static_cast<uint32_t>(s[3]) << 24);
        bits = static_cast<uint16_t>(dequant_bits(fp8_to_float(rec[e]), __uint_as_float(sbits)));
      } else {
        const uint8_t* r = rec + kRopeOffset + 2 * (e - kNopeDim);
        bits = static_cast<uint16_t>(r[0] | (r[1] << 8));
      }
      out[e * dst_col_stride] = bits;
    }
  }
}

// Blocks of 8 warps for one warp per item, as many as the items need (the kernels grid-stride, so
// any grid >= 1 is correct; mutants need not be fast). 0 items: 0 blocks.
unsigned blocks_for(int64_t items) {
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

void gather_op(const at::Tensor& src_cache, const at::Tensor& dst, const at::Tensor& block_table,
               const at::Tensor& workspace_starts, int64_t batch_size,
               const std::optional<at::Tensor>& seq_starts, int64_t bug) {
  TORCH_CHECK(src_cache.is_cuda() && src_cache.scalar_type() == at::kByte && src_cache.dim() == 3,
              "gather mutant: src_cache must be a CUDA uint8 [num_blocks, block_size, 656] tensor");
  TORCH_CHECK(dst.scalar_type() == at::kBFloat16 && dst.dim() == 2, "gather mutant: dst must be bf16 [total, 576]");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2,
              "gather mutant: block_table must be a 2-D int32 tensor");
  TORCH_CHECK(workspace_starts.scalar_type() == at::kInt && workspace_starts.dim() == 1,
              "gather mutant: workspace_starts must be a 1-D int32 tensor");
  const int64_t total = dst.size(0);
  if (total == 0 || batch_size == 0) return;
  GatherParams p;
  p.cache = src_cache.data_ptr<uint8_t>();
  p.block_table = block_table.data_ptr<int32_t>();
  p.ws = workspace_starts.data_ptr<int32_t>();
  p.seq_starts = seq_starts.has_value() ? seq_starts->data_ptr<int32_t>() : nullptr;
  p.total = total;
  p.batch_size = static_cast<int32_t>(batch_size);
  p.block_size = static_cast<int32_t>(src_cache.size(1));
  p.bt_row_stride = block_table.stride(0);
  p.bt_col_stride = block_table.stride(1);
  p.ws_stride = workspace_starts.stride(0);
  p.ss_stride = seq_starts.has_value() ? seq_starts->stride(0) : 0;
  p.cache_block_stride = src_cache.stride(0);
  p.cache_entry_stride = src_cache.stride(1);
  // THE BUG (dst_storage_start): the rows start at the storage's first byte, not at dst's own.
  uint16_t* out = reinterpret_cast<uint16_t*>(dst.data_ptr());
  if (bug == kGatherDstStorageStart) out -= dst.storage_offset();  // storage_offset is in elements
  const c10::cuda::CUDAGuard guard(src_cache.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(src_cache.get_device()).stream();
  gather_mutant_kernel<<<blocks_for(total), kThreads, 0, stream>>>(p, out, dst.stride(0), dst.stride(1),
                                                                  block_table.size(1), bug);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void writer_op(const at::Tensor& kv_c, const at::Tensor& k_pe, const at::Tensor& kv_cache,
               const at::Tensor& slot_mapping, int64_t bug, int64_t scale_rule) {
  TORCH_CHECK(kv_cache.is_cuda() && kv_cache.scalar_type() == at::kByte && kv_cache.dim() == 3,
              "writer mutant: kv_cache must be a CUDA uint8 [num_blocks, block_size, 656] tensor");
  TORCH_CHECK(kv_c.dim() == 2 && k_pe.dim() == 2, "writer mutant: kv_c and k_pe must be 2-D");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1,
              "writer mutant: slot_mapping must be a 1-D int64 tensor");
  const int64_t num_tokens = slot_mapping.size(0);
  // THE BUG (zero_grid) begins here: no early return for num_tokens == 0 ...
  if (num_tokens == 0 && bug != kWriterZeroGrid) return;
  WriterParams p;
  p.kv_c = reinterpret_cast<const uint16_t*>(kv_c.data_ptr());
  p.k_pe = reinterpret_cast<const uint16_t*>(k_pe.data_ptr());
  p.cache = kv_cache.data_ptr<uint8_t>();
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.num_tokens = num_tokens;
  if (bug == kWriterContiguousKvC) {  // THE BUG: [T, 512] and [T, 64] taken to be contiguous
    p.kv_c_row_stride = kNopeDim;
    p.kv_c_col_stride = 1;
    p.k_pe_row_stride = kRopeDim;
    p.k_pe_col_stride = 1;
  } else {
    p.kv_c_row_stride = kv_c.stride(0);
    p.kv_c_col_stride = kv_c.stride(1);
    p.k_pe_row_stride = k_pe.stride(0);
    p.k_pe_col_stride = k_pe.stride(1);
  }
  p.slot_stride = slot_mapping.stride(0);
  p.cache_block_stride = kv_cache.stride(0);
  p.cache_entry_stride = kv_cache.stride(1);
  p.block_size = static_cast<int32_t>(kv_cache.size(1));
  p.kv_c_fp16 = kv_c.scalar_type() == at::kHalf;
  p.pow2_scale = scale_rule == 1;  // the revision's rule, as our writer (writer_device.cuh tile_scale)
  p.convert_rope = false;
  p.aligned8 = (reinterpret_cast<uintptr_t>(p.cache) & 7u) == 0 && p.cache_block_stride % 8 == 0 &&
               p.cache_entry_stride % 8 == 0;
  const c10::cuda::CUDAGuard guard(kv_cache.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(kv_cache.get_device()).stream();
  writer_kernel<<<blocks_for(num_tokens), kThreads, 0, stream>>>(p);
  // ... and ends here: the launch (a zero-size grid: cudaErrorInvalidConfiguration) is not checked,
  // so the error stays pending for whoever makes the next CUDA call.
  if (bug != kWriterZeroGrid) C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace mlafuzz_mutants

TORCH_LIBRARY(mlafuzz_mutants, m) {
  m.def("gather(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor workspace_starts, int batch_size, "
        "Tensor? seq_starts, int bug) -> ()");
  m.def("writer(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, int bug, int scale_rule) -> ()");
}

TORCH_LIBRARY_IMPL(mlafuzz_mutants, CUDA, m) {
  m.impl("gather", &mlafuzz_mutants::gather_op);
  m.impl("writer", &mlafuzz_mutants::writer_op);
}

// A red-zone CUDA allocator for torch.cuda.memory.CUDAPluggableAllocator.
//
// Every allocation gets RZ bytes of canary before and after the user region,
// which ends exactly at the requested size, so a write even one byte past an
// implementation-allocated output (convert's `out`) lands in a canary. The
// canaries are checked when the block is freed and, on demand, for every live
// block (mlafuzz_rz_check_all, called by the harness after each kernel call).
// No caching: each allocation is a cudaMalloc. That is the price of the mode.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {
constexpr size_t kRZ = 4096;  // multiple of 512: the user pointer keeps torch's alignment
constexpr unsigned char kCanary = 0xCB;

struct Block {
  char* base;
  size_t size;
  int device;
};

std::mutex g_mu;
std::unordered_map<void*, Block> g_live;
std::string g_report;  // "ptr size side first_offset count\n" per violation

void note(void* user, const Block& b, const char* side, long first, long count) {
  char line[160];
  std::snprintf(line, sizeof(line), "%p %zu %s %ld %ld\n", user, b.size, side, first, count);
  g_report += line;
}

// Returns the number of zones that were violated (0, 1 or 2) and re-arms them.
int check_block(void* user, const Block& b) {
  std::vector<unsigned char> zone(kRZ);
  int bad = 0;
  const char* sides[2] = {"before", "after"};
  char* starts[2] = {b.base, b.base + kRZ + b.size};
  for (int s = 0; s < 2; ++s) {
    if (cudaMemcpy(zone.data(), starts[s], kRZ, cudaMemcpyDeviceToHost) != cudaSuccess) return bad;
    long first = -1, count = 0;
    for (size_t i = 0; i < kRZ; ++i) {
      if (zone[i] != kCanary) {
        ++count;
        // distance from the user region: bytes before its start, or past its end
        long off = s == 0 ? static_cast<long>(kRZ - i) : static_cast<long>(i);
        if (first < 0 || off < first) first = off;  // the offending byte nearest the region
      }
    }
    if (count) {
      note(user, b, sides[s], first, count);
      cudaMemset(starts[s], kCanary, kRZ);
      ++bad;
    }
  }
  return bad;
}
}  // namespace

extern "C" {

void* mlafuzz_rz_malloc(ssize_t size, int device, cudaStream_t stream) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  char* base = nullptr;
  size_t total = static_cast<size_t>(size) + 2 * kRZ;
  if (cudaMalloc(&base, total) != cudaSuccess) {
    cudaSetDevice(prev);
    return nullptr;
  }
  // Canaries and the user region alike: uninitialised reads see the same bytes every run.
  cudaMemset(base, kCanary, total);
  void* user = base + kRZ;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live[user] = Block{base, static_cast<size_t>(size), device};
  }
  cudaSetDevice(prev);
  (void)stream;
  return user;
}

void mlafuzz_rz_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)size;
  Block b;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_live.find(ptr);
    if (it == g_live.end()) return;
    b = it->second;
    g_live.erase(it);
  }
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaStreamSynchronize(stream);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    check_block(ptr, b);
  }
  cudaFree(b.base);
  cudaSetDevice(prev);
}

// Checks every live block; returns how many zones were violated since the last call.
int mlafuzz_rz_check_all() {
  cudaDeviceSynchronize();
  std::lock_guard<std::mutex> lock(g_mu);
  int bad = 0;
  for (auto& kv : g_live) bad += check_block(kv.first, kv.second);
  return bad;
}

// Returns the report's length; with room (cap > 0) also copies it into buf,
// NUL-terminated, and clears it.
long mlafuzz_rz_take_report(char* buf, long cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  long n = static_cast<long>(g_report.size());
  if (cap > 0 && buf != nullptr) {
    long m = n < cap - 1 ? n : cap - 1;
    std::memcpy(buf, g_report.data(), m);
    buf[m] = 0;
    g_report.clear();
  }
  return n;
}

}  // extern "C"

// mlafuzz planted bug: a host-side dtype check that throws a C++ exception across a boundary that
// cannot carry one (kernels/mutants/host_throw.py loads this through ctypes).
//
// On the H200 image, vLLM's gather host check (a TORCH_CHECK) threw a C++ exception through the
// extension and the process died (SIGSEGV); every such input cost the fuzzer a worker restart.
// Here the exception escapes a noexcept function, which the C++ standard answers with
// std::terminate: the process aborts (SIGABRT) on every machine and compiler, so the planted crash
// is deterministic on the CPU CI as on the GPU. No torch headers: g++ alone builds it.

#include <stdexcept>

namespace {

void require_bf16(int dtype_code, int bf16_code) {
  if (dtype_code != bf16_code) throw std::invalid_argument("gather: dst must be bfloat16");
}

}  // namespace

// Returns normally only when dtype_code == bf16_code.
extern "C" void mlafuzz_mutant_check_dst_dtype(int dtype_code, int bf16_code) noexcept {
  require_bf16(dtype_code, bf16_code);  // a throw here reaches the noexcept boundary: terminate
}

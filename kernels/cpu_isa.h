// Which SIMD instruction set the CPU kernels use (linear, SnapKV selection).
//
// Chosen once per process: the widest the CPU supports, optionally capped by
// the environment variable SNAPSERVE_CPU_ISA = portable | avx2 | avx512, so
// that tests can run every path on one machine and a deployment can pin one.
// A kernel's order of floating-point operations depends on this choice, which
// is why it is made once: every row of every batch then uses the same path.
#pragma once

namespace snapserve::kernels {

enum class CpuIsa {
  kPortable,  // plain C++
  kAvx2,      // AVX2 + FMA + F16C
  kAvx512,    // AVX-512F (+ AVX2 + FMA + F16C)
};

CpuIsa cpu_isa();

// "portable", "avx2" or "avx512".
const char* cpu_isa_name(CpuIsa isa);

}  // namespace snapserve::kernels

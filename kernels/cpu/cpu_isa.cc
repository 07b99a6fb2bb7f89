#include "kernels/cpu/cpu_isa.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace snapserve::kernels {

namespace {

#if defined(__x86_64__)
// F16C (half <-> float conversion), used by the quantized kernels for block
// scales. Read from CPUID: GCC 12's __builtin_cpu_supports("f16c") answers 0
// even on CPUs that have it.
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

// AVX512_BF16: CPUID leaf 7, sub-leaf 1, EAX bit 5.
bool cpuid_avx512_bf16() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
#else
  return false;
#endif
}

// AMX-TILE and AMX-BF16: CPUID leaf 7, sub-leaf 0, EDX bits 24 and 22.
bool cpuid_amx_bf16() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 &&
         (edx & (kAmxBf16 | kAmxTile)) == (kAmxBf16 | kAmxTile);
#else
  return false;
#endif
}

// Asks Linux for the tile registers' state (8 KiB per thread, so not handed
// out unasked: Documentation/arch/x86/xstate.rst). Process-wide, for every
// thread; without it the first tile instruction faults. False where the
// kernel refuses (older than 5.16, or a hypervisor that hides XTILEDATA).
bool request_amx_permission() {
#if defined(__x86_64__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuIsa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  if (!avx2 || !__builtin_cpu_supports("avx512f")) return avx2 ? CpuIsa::kAvx2 : CpuIsa::kPortable;
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni")) {
    return cpuid_avx512_bf16() && cpuid_amx_bf16() ? CpuIsa::kAmx : CpuIsa::kAvx512Vnni;
  }
  return CpuIsa::kAvx512;
#endif
  return CpuIsa::kPortable;
}

CpuIsa choose() {
  const CpuIsa supported = detect();
  const char* env = std::getenv("SNAPSERVE_CPU_ISA");
  if (env == nullptr || *env == '\0') return supported;
  const std::string_view want(env);
  CpuIsa cap;
  if (want == "portable") {
    cap = CpuIsa::kPortable;
  } else if (want == "avx2") {
    cap = CpuIsa::kAvx2;
  } else if (want == "avx512") {
    cap = CpuIsa::kAvx512;
  } else if (want == "avx512vnni") {
    cap = CpuIsa::kAvx512Vnni;
  } else if (want == "amx") {
    cap = CpuIsa::kAmx;
  } else {
    TORCH_CHECK(false, "SNAPSERVE_CPU_ISA=", want,
                ": expected portable, avx2, avx512, avx512vnni or amx");
  }
  // A cap above what the CPU has would crash on an illegal instruction.
  return static_cast<int>(cap) < static_cast<int>(supported) ? cap : supported;
}

// The level chosen, with the tile state requested only where AMX is chosen.
CpuIsa choose_and_enable() {
  const CpuIsa isa = choose();
  if (isa == CpuIsa::kAmx && !request_amx_permission()) return CpuIsa::kAvx512Vnni;
  return isa;
}

}  // namespace

CpuIsa cpu_isa() {
  static const CpuIsa isa = choose_and_enable();
  return isa;
}

bool bf16_dot_outpaces_fma() {
  static const bool faster = [] {
#if defined(__x86_64__)
    if (!has_avx512_bf16()) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
    // "AuthenticAMD" in EBX, EDX, ECX.
    return ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
#else
    return false;
#endif
  }();
  return faster;
}

bool has_avx512_bf16() {
  static const bool has = cpu_isa() >= CpuIsa::kAvx512Vnni && cpuid_avx512_bf16();
  return has;
}

bool has_amx_bf16() { return cpu_isa() >= CpuIsa::kAmx; }

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAmx:
      return "amx";
    case CpuIsa::kAvx512Vnni:
      return "avx512vnni";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kPortable:
      break;
  }
  return "portable";
}

}  // namespace snapserve::kernels

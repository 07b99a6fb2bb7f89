// kernels/cpu_isa: the widest instruction set the CPU has, capped by
// SNAPSERVE_CPU_ISA. tests/CMakeLists.txt runs this binary once per cap, so
// this test also proves that those runs really take the narrower paths.
#include "kernels/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace snapserve::kernels {
namespace {

// The first line of a field of /proc/cpuinfo ("" when absent): the
// kernel's reading of the CPU, independent of the CPUID code under test.
std::string CpuinfoField(const std::string& name) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const size_t colon = line.find(':');
    return colon == std::string::npos ? "" : line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "";
}

CpuIsa Supported() {
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx2 || !__builtin_cpu_supports("avx512f")) return avx2 ? CpuIsa::kAvx2 : CpuIsa::kPortable;
  const bool vnni = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vnni");
  if (!vnni) return CpuIsa::kAvx512;
  // AMX from the kernel's reading of CPUID (and only where the kernel
  // hands out the tile state: Linux 5.16 on, the same kernels that list
  // the flags), independent of the code under test.
  const std::string flags = " " + CpuinfoField("flags") + " ";
  const bool amx = flags.find(" avx512_bf16 ") != std::string::npos &&
                   flags.find(" amx_tile ") != std::string::npos &&
                   flags.find(" amx_bf16 ") != std::string::npos;
  return amx ? CpuIsa::kAmx : CpuIsa::kAvx512Vnni;
#endif
  return CpuIsa::kPortable;
}

TEST(CpuIsa, WidestSupportedUnderTheEnvironmentCap) {
  const char* env = std::getenv("SNAPSERVE_CPU_ISA");
  const CpuIsa supported = Supported();
  if (env == nullptr || *env == '\0') {
    EXPECT_EQ(cpu_isa(), supported);
    return;
  }
  const std::string cap(env);
  // The cap is honoured where the CPU has it; never above what the CPU has.
  EXPECT_LE(static_cast<int>(cpu_isa()), static_cast<int>(supported));
  if (cap == "portable" || (cap == "avx2" && supported != CpuIsa::kPortable) ||
      (cap == "avx512" && supported >= CpuIsa::kAvx512) ||
      (cap == "avx512vnni" && supported >= CpuIsa::kAvx512Vnni) ||
      (cap == "amx" && supported == CpuIsa::kAmx)) {
    EXPECT_EQ(std::string(cpu_isa_name(cpu_isa())), cap);
  }
}

TEST(CpuIsa, Names) {
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kPortable), "portable");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAvx2), "avx2");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAvx512), "avx512");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAvx512Vnni), "avx512vnni");
  EXPECT_STREQ(cpu_isa_name(CpuIsa::kAmx), "amx");
}

TEST(CpuIsa, BFloat16DotOutpacesFmaOnAmdOnly) {
  const std::string vendor = CpuinfoField("vendor_id");
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  const bool bf16 = CpuinfoField("flags").find(" avx512_bf16") != std::string::npos;
  // has_avx512_bf16 also needs the level avx512vnni or above (no lower cap).
  EXPECT_EQ(has_avx512_bf16(), bf16 && cpu_isa() >= CpuIsa::kAvx512Vnni);
  EXPECT_EQ(bf16_dot_outpaces_fma(), has_avx512_bf16() && vendor == "AuthenticAMD") << vendor;
}

}  // namespace
}  // namespace snapserve::kernels

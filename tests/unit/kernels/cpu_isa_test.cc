// kernels/cpu_isa: the widest instruction set the CPU has, capped by
// SNAPSERVE_CPU_ISA. tests/CMakeLists.txt runs this binary once per cap, so
// this test also proves that those runs really take the narrower paths.
#include "kernels/cpu/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/unit/common/hardware_skip.h"

namespace snapserve::kernels {
namespace {

using test_support::CpuinfoField;

// What the CPU has, independent of the code under test.
CpuIsa Supported() { return test_support::CpuLevelWithoutCap(); }

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
  // No vendor_id (not an x86 CPU): not AMD, so false as well.
  const std::string vendor = CpuinfoField("vendor_id");
  const bool bf16 = CpuinfoField("flags").find(" avx512_bf16") != std::string::npos;
  // has_avx512_bf16 also needs the level avx512vnni or above (no lower cap).
  EXPECT_EQ(has_avx512_bf16(), bf16 && cpu_isa() >= CpuIsa::kAvx512Vnni);
  EXPECT_EQ(bf16_dot_outpaces_fma(), has_avx512_bf16() && vendor == "AuthenticAMD") << vendor;
}

}  // namespace
}  // namespace snapserve::kernels

// The one way a unit test skips: for a CPU feature that the instruction-set
// level in effect lacks (what the CPU has, capped by SNAPSERVE_CPU_ISA,
// kernels/cpu/cpu_isa.h). Every such skip says "needs CPU feature <name>", which
// is what ctest's skip pattern and scripts/ctest-skips.py look for: `make
// test-unit` lists these skips by name and fails on any other skip, so a test
// must not skip for anything but the hardware under it.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "kernels/cpu/cpu_isa.h"

namespace snapserve::test_support {

// The first line of a field of /proc/cpuinfo ("" when absent): the Linux
// kernel's reading of the CPU, independent of the CPUID code under test.
inline std::string CpuinfoField(const std::string& name) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return "";
    const size_t value = line.find_first_not_of(' ', colon + 1);
    return value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

// The widest level this CPU has, whatever SNAPSERVE_CPU_ISA says, read
// without kernels/cpu/cpu_isa.cc: the compiler's CPU model and /proc/cpuinfo.
inline kernels::CpuIsa CpuLevelWithoutCap() {
  using kernels::CpuIsa;
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx2 || !__builtin_cpu_supports("avx512f")) return avx2 ? CpuIsa::kAvx2 : CpuIsa::kPortable;
  const bool vnni = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vnni");
  if (!vnni) return CpuIsa::kAvx512;
  // AMX as the kernel lists it (Linux 5.16 on, the kernels that hand out
  // the tile state).
  const std::string flags = " " + CpuinfoField("flags") + " ";
  const bool amx = flags.find(" avx512_bf16 ") != std::string::npos &&
                   flags.find(" amx_tile ") != std::string::npos &&
                   flags.find(" amx_bf16 ") != std::string::npos;
  return amx ? CpuIsa::kAmx : CpuIsa::kAvx512Vnni;
#endif
  return CpuIsa::kPortable;
}

// Why a test skips: the feature's name, and the cap when one is set (under a
// cap a CPU that has the feature still skips the test).
inline std::string MissingCpuFeatureReason(std::string_view feature) {
  std::string reason = "needs CPU feature ";
  reason += feature;
  const char* cap = std::getenv("SNAPSERVE_CPU_ISA");
  if (cap != nullptr && *cap != '\0') {
    reason += " (this run: SNAPSERVE_CPU_ISA=";
    reason += cap;
    reason += ")";
  }
  return reason;
}

// The feature a SNAPSERVE_CPU_ISA level needs beyond the one below it, and
// whether this CPU has that level; an unknown name counts as present
// (kernels/cpu/cpu_isa.cc refuses it, and cpu_isa_test checks that).
struct CapLevel {
  const char* feature;
  bool present;
};

inline CapLevel CapLevelOnThisCpu(std::string_view cap) {
  using kernels::CpuIsa;
  const CpuIsa cpu = CpuLevelWithoutCap();
  if (cap == "avx2") return {"avx2", cpu >= CpuIsa::kAvx2};
  if (cap == "avx512") return {"avx512f", cpu >= CpuIsa::kAvx512};
  if (cap == "avx512vnni") return {"avx512vnni", cpu >= CpuIsa::kAvx512Vnni};
  if (cap == "amx") return {"amx-bf16", cpu >= CpuIsa::kAmx};
  return {"", true};
}

}  // namespace snapserve::test_support

// Skips the calling test (or fixture SetUp) unless `available`; `feature`
// names what is missing ("avx512f", "avx512vnni", "amx-bf16", ...).
#define SNAPSERVE_SKIP_UNLESS_CPU(available, feature) \
  if (available) {                                    \
  } else                                              \
    GTEST_SKIP() << ::snapserve::test_support::MissingCpuFeatureReason(feature)

namespace snapserve::test_support {

// ctest runs the kernel tests once per SNAPSERVE_CPU_ISA cap
// (tests/CMakeLists.txt). A cap above what the CPU has would only rerun a
// narrower path under the wider path's name, so under it every test of the
// binary skips. GoogleTest prints no "[  SKIPPED ]" line for a skip in a
// global set-up, so this prints one for ctest's skip pattern.
class CpuIsaCapEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* cap = std::getenv("SNAPSERVE_CPU_ISA");
    if (cap == nullptr) return;
    const CapLevel level = CapLevelOnThisCpu(cap);
    if (!level.present) {
      std::printf("[  SKIPPED ] every test of this run: %s\n",
                  MissingCpuFeatureReason(level.feature).c_str());
    }
    SNAPSERVE_SKIP_UNLESS_CPU(level.present, level.feature);
  }
};

}  // namespace snapserve::test_support

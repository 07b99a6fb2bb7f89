// Skips every test of a binary that ctest runs under a SNAPSERVE_CPU_ISA cap
// this CPU lacks (tests/unit/common/hardware_skip.h); linked into the
// binaries that tests/CMakeLists.txt runs once per cap.
#include "tests/unit/common/hardware_skip.h"

namespace {

[[maybe_unused]] ::testing::Environment* const kCpuIsaCapEnvironment =
    ::testing::AddGlobalTestEnvironment(new snapserve::test_support::CpuIsaCapEnvironment);

}  // namespace

#include "kernels/cpu/huge_pages.h"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace snapserve::kernels {

bool AdviseHugePages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (!t.defined() || !t.is_cpu()) return false;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  char* data = static_cast<char*>(t.data_ptr());
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + static_cast<uintptr_t>(t.nbytes());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);  // whole huge pages only
  const uintptr_t last = end & ~(kHuge - 1);
  if (last <= first) return false;
  return madvise(data + (first - begin), last - first, MADV_HUGEPAGE) == 0;
#else
  (void)t;
  return false;
#endif
}

}  // namespace snapserve::kernels

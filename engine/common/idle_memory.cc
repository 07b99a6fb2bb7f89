#include "engine/common/idle_memory.h"

#include "engine/common/reusing_cpu_allocator.h"

#include <cstdlib>  // any libc header defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace snapserve {

void ReturnFreedHeapToSystem() {
  ReleaseCachedCpuBuffers();
#if defined(__GLIBC__)
  // 0: keep no padding at the top of the main heap; every arena is trimmed
  // and free pages inside it are released too (madvise), not only its top.
  malloc_trim(0);
#endif
}

}  // namespace snapserve

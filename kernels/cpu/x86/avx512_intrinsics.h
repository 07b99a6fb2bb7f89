// <immintrin.h> for the AVX-512 kernel files (x86-64 only), and the target
// attribute of their plain AVX-512F functions. Internal to kernels/.
//
// GCC 12's AVX-512 intrinsics pass an undefined "passthrough" vector to the
// masked builtins, which -W(maybe-)uninitialized reports at every inlined
// use. The pragmas hold for the rest of the including file.
#pragma once

#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SNAPSERVE_AVX512F __attribute__((target("avx512f")))

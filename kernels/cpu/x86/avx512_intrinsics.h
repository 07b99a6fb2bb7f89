// <immintrin.h> for the AVX-512 kernel files (x86-64 only), with the warnings
// its masked intrinsics raise turned off. Internal to kernels/. Target
// attributes: kernels/cpu/x86/isa_target.h.
//
// GCC 12's AVX-512 intrinsics pass an undefined "passthrough" vector to the
// masked builtins, which -W(maybe-)uninitialized reports at every inlined
// use. The pragmas hold for the rest of the including file.
#pragma once

#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

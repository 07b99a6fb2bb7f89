# LibTorch's ATen headers are most of every translation unit's compile time
# (about three quarters of a typical engine file). Each target that includes
# them precompiles them once for its own flags: a precompiled header is only
# valid for the exact macro set it was built with, and targets differ in
# OpenMP (_OPENMP, _REENTRANT) and definitions, so one shared header would be
# silently ignored by half of them.
#
# Turned off with -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON, which the clang
# builds (clang-tidy, fuzzing) use: GCC's precompiled headers mean nothing to
# clang.
function(snapserve_precompile_torch_headers target)
  target_precompile_headers(${target} PRIVATE
                            "$<$<COMPILE_LANGUAGE:CXX>:<ATen/ATen.h$<ANGLE-R>>"
                            "$<$<COMPILE_LANGUAGE:CXX>:<ATen/Parallel.h$<ANGLE-R>>")
endfunction()

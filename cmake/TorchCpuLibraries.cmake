# LibTorch's CPU libraries from the venv's torch wheel, without the CUDA toolkit.
#
# The PyPI torch wheel is built with CUDA, and its TorchConfig.cmake refuses to
# configure unless it finds nvcc and the toolkit's libraries, even though the
# CPU libraries (libtorch_cpu, libc10) need neither: a fresh Debian machine
# with no CUDA toolkit (the CPU container image, a laptop) could not build at
# all. When snapserve builds without its CUDA kernels, this defines the same
# `torch` target from the wheel's files directly; the CUDA libraries the
# wheel's libtorch.so loads come from the pip nvidia-* packages next to it at
# run time, and no GPU is needed for them to load.
#
# In: Torch_DIR (<site-packages>/torch/share/cmake/Torch, from the Makefile).
# Out: the imported target `torch`, TORCH_INSTALL_PREFIX, Torch_FOUND.

if(NOT Torch_DIR)
  message(FATAL_ERROR "Torch_DIR is not set: run through the Makefile, or pass "
                      "-DTorch_DIR=<site-packages>/torch/share/cmake/Torch")
endif()
get_filename_component(TORCH_INSTALL_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
set(_snapserve_torch_lib "${TORCH_INSTALL_PREFIX}/lib")
foreach(_name torch torch_cpu c10)
  if(NOT EXISTS "${_snapserve_torch_lib}/lib${_name}.so")
    message(FATAL_ERROR "LibTorch: ${_snapserve_torch_lib}/lib${_name}.so not found "
                        "(is Torch_DIR the torch wheel's share/cmake/Torch?)")
  endif()
endforeach()

add_library(torch SHARED IMPORTED)
set_target_properties(torch PROPERTIES
  IMPORTED_LOCATION "${_snapserve_torch_lib}/libtorch.so"
  INTERFACE_INCLUDE_DIRECTORIES
    "${TORCH_INSTALL_PREFIX}/include;${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include"
  # The definitions the wheel's own targets export: headers change with them.
  INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE"
  INTERFACE_LINK_LIBRARIES "${_snapserve_torch_lib}/libtorch_cpu.so;${_snapserve_torch_lib}/libc10.so"
  INTERFACE_COMPILE_FEATURES cxx_std_20)
set(Torch_FOUND TRUE)
message(STATUS "snapserve: LibTorch CPU libraries from ${_snapserve_torch_lib} (no CUDA toolkit needed)")

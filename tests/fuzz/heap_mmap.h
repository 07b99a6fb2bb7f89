// Forced into gguf_file.cc and safetensors.cc when the fuzzers compile them
// (tests/fuzz/CMakeLists.txt, `-include`): their ::mmap / ::munmap become a
// copy of the file into malloc'd memory of exactly the file's size. A page of
// an mmap'd file reads as zeros past its end, so an off-by-a-few read would go
// unnoticed; in heap memory AddressSanitizer's redzones report it at the first
// byte. The parser sources themselves are compiled unchanged.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <cstddef>

void* SnapserveFuzzMmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset);
int SnapserveFuzzMunmap(void* addr, size_t length);

#define mmap SnapserveFuzzMmap
#define munmap SnapserveFuzzMunmap

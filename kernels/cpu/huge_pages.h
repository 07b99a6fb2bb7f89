// Backing large, randomly read CPU buffers with 2 MiB pages.
//
// The paged KV cache is read as scattered 2-4 KiB blocks (one block per layer
// and KV head lane, docs/kv-cache-and-scheduling.md), so with 4 KiB pages
// nearly every block a decode step reads first misses the TLB, and its
// prefetch waits on a page walk. Debian's kernels enable transparent huge
// pages only for memory that asks for them (`madvise` mode), so the buffers
// that are read this way ask.
#pragma once

#include <ATen/core/Tensor.h>

namespace snapserve::kernels {

// Advises the kernel to back the whole 2 MiB pages inside `t`'s CPU memory
// with huge pages (madvise MADV_HUGEPAGE). Call it before the memory is first
// written: pages already faulted in stay 4 KiB until the kernel's background
// collapse gets to them. Best effort, never fails: returns whether the advice
// was taken (false off Linux, for other devices, for buffers under 2 MiB, or
// where the kernel refuses it).
bool AdviseHugePages(const at::Tensor& t);

}  // namespace snapserve::kernels

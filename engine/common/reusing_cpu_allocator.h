// LibTorch's CPU allocator for the serving process: large buffers are kept
// for reuse between steps instead of going back to glibc.
//
// Why: a prompt step allocates and frees the same large buffers layer after
// layer (the MLP's [rows, 2 * intermediate] output is 25 MB at 2,048 rows).
// glibc serves the scheduler thread from a per-thread arena made of 64 MiB
// heaps, and it unmaps a heap as soon as it empties. When a step's live
// memory spans heaps, as SnapKV's prompts do (every layer's keys and values
// stay until the prompt ends), buffers keep landing on fresh pages: a W3
// round with SnapKV spent 5 % of its samples in the kernel's page faults and
// page clearing, against 1 % without compression
// (docs/kv-cache-and-scheduling.md, "Memory when idle").
//
// What it does: allocations of at least kMinCachedBytes get their own
// anonymous mapping; when freed they go to a free list (up to
// kMaxCachedBytes in all) from which the next allocation of a similar size
// (the smallest cached block at most 25 % larger) is served. Smaller
// allocations go to LibTorch's default allocator. ReleaseCachedCpuBuffers()
// unmaps the free list; the scheduler calls it when the server goes idle.
#pragma once

#include <cstddef>

namespace snapserve {

// Buffers below this size stay with glibc, which serves them well from its
// arenas.
inline constexpr size_t kMinCachedBytes = size_t{1} << 20;
// The most free bytes kept for reuse under load; beyond it freed blocks are
// unmapped at once. Four times a 2,048-token prompt step's largest buffers.
inline constexpr size_t kMaxCachedBytes = size_t{512} << 20;

// Makes the reusing allocator LibTorch's CPU allocator (once; later calls do
// nothing; in AddressSanitizer builds never, so that ASan keeps checking
// large buffers). Tensors allocated before keep their own deleters, so it
// may be installed after the model has loaded.
void InstallReusingCpuAllocator();

// Unmaps every cached free block. Returns the bytes given back.
size_t ReleaseCachedCpuBuffers();

// Free bytes held for reuse now (for tests and logs).
size_t CachedCpuBufferBytes();

}  // namespace snapserve

// Returning the heap's free pages to the system when the server goes idle.
//
// A prompt's prefill allocates activations and attention scores in proportion
// to its length, freed when the step ends. glibc's malloc keeps freed memory
// in its per-thread arenas for reuse, so without this the resident set of an
// idle server stays at the high-water mark of the largest prompts seen, and a
// soak cannot tell allocator caching from a leak
// (docs/kv-cache-and-scheduling.md, "Memory when idle").
#pragma once

namespace snapserve {

// Asks the allocator to give free heap pages back to the system (glibc's
// malloc_trim over every arena); a no-op elsewhere. The pages given back
// fault in again on the next use, so call it once the server has gone idle,
// not per step or per request.
void ReturnFreedHeapToSystem();

}  // namespace snapserve

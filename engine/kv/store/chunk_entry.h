// The bytes of one prefix-cache chunk in a shared store (docs/kv-cache-and-
// scheduling.md, "Shared tier in Redis"). A store entry is a 64-byte header,
// the chunk's tokens, then its K and V:
//
//   offset size
//        0    4  magic "SKVC"
//        4    2  format version (kChunkEntryVersion)
//        6    2  dtype code (ChunkDtype)
//        8    8  model fingerprint (what the K/V depend on besides tokens)
//       16   16  layers, KV heads, head_dim, chunk tokens (4 x u32)
//       32    8  the chunk's chain hash (the store's key names it too)
//       40    8  the parent chunk's chain hash (the fingerprint for a first chunk)
//       48    8  payload bytes (K then V, each [layers, KV heads, tokens, head_dim])
//       56    4  CRC-32 (zlib.crc32's) of every byte of the entry but these 8
//       60    4  zero
//       64       tokens (chunk tokens x i32), then the payload
//
// Integers are little-endian. A reader refuses an entry whose bytes are not
// exactly this (truncated, format), whose checksum fails (checksum), or
// whose fingerprint, dtype, layout or hash is not the reader's (wrong_model):
// the chunk is then recomputed, never served. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace snapserve::kv {

inline constexpr uint16_t kChunkEntryVersion = 1;
inline constexpr size_t kChunkEntryHeaderBytes = 64;

// Element types a chunk's K/V can have (the model's compute dtype).
enum class ChunkDtype : uint16_t { kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3 };
size_t ChunkDtypeBytes(ChunkDtype dtype);

// The CRC-32 of `bytes` (the same value as zlib.crc32 / zlib's crc32()).
uint32_t Crc32(std::string_view bytes);

// What a chunk entry must match to be served.
struct ChunkEntryLayout {
  uint64_t fingerprint = 0;
  ChunkDtype dtype = ChunkDtype::kFloat32;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t chunk_tokens = 0;

  // Bytes of K (and of V): layers x KV heads x chunk tokens x head_dim elements.
  size_t HalfPayloadBytes() const;
  size_t EntryBytes() const;  // header + tokens + K + V
};

// Why an entry was refused (also the label of the store's error counter).
enum class ChunkEntryError { kNone, kTruncated, kFormat, kChecksum, kWrongModel };
const char* chunk_entry_error_name(ChunkEntryError error);

// The entry of chunk `hash` (chain parent `parent`, `tokens` of it), whose
// K and V bytes are `k` and `v` (layout.HalfPayloadBytes() each).
std::string EncodeChunkEntry(const ChunkEntryLayout& layout, uint64_t hash, uint64_t parent,
                             std::span<const int32_t> tokens, std::span<const std::byte> k,
                             std::span<const std::byte> v);

struct DecodedChunkEntry {
  uint64_t parent = 0;
  std::vector<int32_t> tokens;
  // Views into the decoded bytes.
  std::span<const std::byte> k, v;
};

// Checks `bytes` against `layout` and `hash` and fills `out`; kNone when
// the entry can be served.
ChunkEntryError DecodeChunkEntry(std::string_view bytes, const ChunkEntryLayout& layout,
                                 uint64_t hash, DecodedChunkEntry* out);

}  // namespace snapserve::kv

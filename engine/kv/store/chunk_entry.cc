#include "engine/kv/store/chunk_entry.h"

#include <array>
#include <bit>
#include <cstring>

namespace snapserve::kv {

// Entries are written with memcpy of native integers: the hosts snapserve
// runs on (x86-64, AArch64) are little-endian, as the format is.
static_assert(std::endian::native == std::endian::little);

namespace {

constexpr char kMagic[4] = {'S', 'K', 'V', 'C'};
constexpr size_t kChecksumOffset = 56;

template <typename T>
void Put(std::string& out, size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

template <typename T>
T Get(std::string_view in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

// CRC-32 (the polynomial of zlib, PNG and Ethernet, reflected), eight bytes
// a step with eight tables ("slicing by 8"): a chunk is megabytes and its
// checksum is computed on every read and write.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

CrcTables MakeCrcTables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}

// Continues a CRC-32 whose running value (before the final inversion) is `crc`.
uint32_t CrcUpdate(uint32_t crc, const char* data, size_t size) {
  static const CrcTables t = MakeCrcTables();
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

// The checksum of an entry: every byte but the checksum and the zero word.
uint32_t EntryChecksum(std::string_view entry) {
  uint32_t crc = CrcUpdate(0xFFFFFFFFu, entry.data(), kChecksumOffset);
  crc =
      CrcUpdate(crc, entry.data() + kChunkEntryHeaderBytes, entry.size() - kChunkEntryHeaderBytes);
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace

uint32_t Crc32(std::string_view bytes) {
  return CrcUpdate(0xFFFFFFFFu, bytes.data(), bytes.size()) ^ 0xFFFFFFFFu;
}

size_t ChunkDtypeBytes(ChunkDtype dtype) {
  switch (dtype) {
    case ChunkDtype::kFloat32:
      return 4;
    case ChunkDtype::kBFloat16:
    case ChunkDtype::kFloat16:
      return 2;
  }
  return 0;
}

size_t ChunkEntryLayout::HalfPayloadBytes() const {
  return static_cast<size_t>(num_layers) * num_kv_heads * chunk_tokens * head_dim *
         ChunkDtypeBytes(dtype);
}

size_t ChunkEntryLayout::EntryBytes() const {
  return kChunkEntryHeaderBytes + chunk_tokens * sizeof(int32_t) + 2 * HalfPayloadBytes();
}

const char* chunk_entry_error_name(ChunkEntryError error) {
  switch (error) {
    case ChunkEntryError::kNone:
      return "none";
    case ChunkEntryError::kTruncated:
      return "truncated";
    case ChunkEntryError::kFormat:
      return "format";
    case ChunkEntryError::kChecksum:
      return "checksum";
    case ChunkEntryError::kWrongModel:
      return "wrong_model";
  }
  return "unknown";
}

std::string EncodeChunkEntry(const ChunkEntryLayout& layout, uint64_t hash, uint64_t parent,
                             std::span<const int32_t> tokens, std::span<const std::byte> k,
                             std::span<const std::byte> v) {
  const size_t half = layout.HalfPayloadBytes();
  if (tokens.size() != layout.chunk_tokens || k.size() != half || v.size() != half) return {};
  std::string out(layout.EntryBytes(), '\0');
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  Put<uint16_t>(out, 4, kChunkEntryVersion);
  Put<uint16_t>(out, 6, static_cast<uint16_t>(layout.dtype));
  Put<uint64_t>(out, 8, layout.fingerprint);
  Put<uint32_t>(out, 16, layout.num_layers);
  Put<uint32_t>(out, 20, layout.num_kv_heads);
  Put<uint32_t>(out, 24, layout.head_dim);
  Put<uint32_t>(out, 28, layout.chunk_tokens);
  Put<uint64_t>(out, 32, hash);
  Put<uint64_t>(out, 40, parent);
  Put<uint64_t>(out, 48, static_cast<uint64_t>(2 * half));
  size_t at = kChunkEntryHeaderBytes;
  std::memcpy(out.data() + at, tokens.data(), tokens.size_bytes());
  at += tokens.size_bytes();
  std::memcpy(out.data() + at, k.data(), half);
  std::memcpy(out.data() + at + half, v.data(), half);
  Put<uint32_t>(out, kChecksumOffset, EntryChecksum(out));
  return out;
}

ChunkEntryError DecodeChunkEntry(std::string_view bytes, const ChunkEntryLayout& layout,
                                 uint64_t hash, DecodedChunkEntry* out) {
  if (bytes.size() < kChunkEntryHeaderBytes) {
    // Too short for a header: a cut entry if what is there starts like one.
    const size_t n = bytes.size() < sizeof(kMagic) ? bytes.size() : sizeof(kMagic);
    return std::memcmp(bytes.data(), kMagic, n) == 0 ? ChunkEntryError::kTruncated
                                                     : ChunkEntryError::kFormat;
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0 ||
      Get<uint16_t>(bytes, 4) != kChunkEntryVersion || Get<uint32_t>(bytes, 60) != 0) {
    return ChunkEntryError::kFormat;
  }
  // The sizes the header itself declares; the layout is compared below,
  // after the checksum has shown the header is what its writer wrote.
  ChunkEntryLayout declared;
  declared.dtype = static_cast<ChunkDtype>(Get<uint16_t>(bytes, 6));
  declared.num_layers = Get<uint32_t>(bytes, 16);
  declared.num_kv_heads = Get<uint32_t>(bytes, 20);
  declared.head_dim = Get<uint32_t>(bytes, 24);
  declared.chunk_tokens = Get<uint32_t>(bytes, 28);
  const uint64_t payload = Get<uint64_t>(bytes, 48);
  if (ChunkDtypeBytes(declared.dtype) == 0 || payload != 2 * declared.HalfPayloadBytes() ||
      declared.chunk_tokens > (uint32_t{1} << 24)) {
    return ChunkEntryError::kFormat;
  }
  const size_t expected = declared.EntryBytes();
  if (bytes.size() < expected) return ChunkEntryError::kTruncated;
  if (bytes.size() > expected) return ChunkEntryError::kFormat;
  if (Get<uint32_t>(bytes, kChecksumOffset) != EntryChecksum(bytes)) {
    return ChunkEntryError::kChecksum;
  }
  if (Get<uint64_t>(bytes, 8) != layout.fingerprint || declared.dtype != layout.dtype ||
      declared.num_layers != layout.num_layers || declared.num_kv_heads != layout.num_kv_heads ||
      declared.head_dim != layout.head_dim || declared.chunk_tokens != layout.chunk_tokens ||
      Get<uint64_t>(bytes, 32) != hash) {
    return ChunkEntryError::kWrongModel;
  }
  out->parent = Get<uint64_t>(bytes, 40);
  out->tokens.resize(layout.chunk_tokens);
  std::memcpy(out->tokens.data(), bytes.data() + kChunkEntryHeaderBytes,
              out->tokens.size() * sizeof(int32_t));
  const size_t half = layout.HalfPayloadBytes();
  const auto* payload_start = reinterpret_cast<const std::byte*>(bytes.data()) +
                              kChunkEntryHeaderBytes + layout.chunk_tokens * sizeof(int32_t);
  out->k = std::span<const std::byte>(payload_start, half);
  out->v = std::span<const std::byte>(payload_start + half, half);
  return ChunkEntryError::kNone;
}

}  // namespace snapserve::kv

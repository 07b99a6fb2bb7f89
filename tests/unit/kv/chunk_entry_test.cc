#include "engine/kv/store/chunk_entry.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace snapserve::kv {
namespace {

ChunkEntryLayout Layout(uint64_t fingerprint = 0x1234'5678'9abc'def0ull) {
  ChunkEntryLayout l;
  l.fingerprint = fingerprint;
  l.dtype = ChunkDtype::kFloat32;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 4;
  l.chunk_tokens = 5;
  return l;
}

struct Chunk {
  std::vector<int32_t> tokens;
  std::vector<std::byte> k, v;
};

Chunk MakeChunk(const ChunkEntryLayout& l, uint32_t seed) {
  std::mt19937 rng(seed);
  Chunk c;
  c.tokens.resize(l.chunk_tokens);
  for (int32_t& t : c.tokens) t = static_cast<int32_t>(rng() % 50000);
  c.k.resize(l.HalfPayloadBytes());
  c.v.resize(l.HalfPayloadBytes());
  for (std::byte& b : c.k) b = static_cast<std::byte>(rng());
  for (std::byte& b : c.v) b = static_cast<std::byte>(rng());
  return c;
}

std::string Encode(const ChunkEntryLayout& l, const Chunk& c, uint64_t hash = 42,
                   uint64_t parent = 7) {
  return EncodeChunkEntry(l, hash, parent, c.tokens, c.k, c.v);
}

template <typename T>
T At(const std::string& s, size_t offset) {
  T v;
  std::memcpy(&v, s.data() + offset, sizeof(T));
  return v;
}

// CRC-32 one bit at a time, straight from the reflected polynomial: the
// reference the table-driven one must equal.
uint32_t BitwiseCrc32(std::string_view s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : s) {
    crc ^= byte;
    for (int i = 0; i < 8; ++i) crc = (crc & 1) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

TEST(Crc32Test, MatchesTheStandardCheckValueAndABitwiseReference) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);  // the CRC-32 catalogue's check value
  EXPECT_EQ(Crc32(""), 0u);
  std::mt19937 rng(3);
  for (size_t n : {1, 7, 8, 9, 63, 1000, 4099}) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    EXPECT_EQ(Crc32(s), BitwiseCrc32(s)) << n;
  }
}

TEST(ChunkEntryTest, RoundTripsTokensParentAndKv) {
  const ChunkEntryLayout l = Layout();
  const Chunk c = MakeChunk(l, 1);
  const std::string entry = Encode(l, c, 99, 1234);
  ASSERT_EQ(entry.size(), l.EntryBytes());
  EXPECT_EQ(entry.size(), 64 + 5 * 4 + 2 * (3 * 2 * 5 * 4 * 4));
  DecodedChunkEntry d;
  ASSERT_EQ(DecodeChunkEntry(entry, l, 99, &d), ChunkEntryError::kNone);
  EXPECT_EQ(d.parent, 1234u);
  EXPECT_EQ(d.tokens, c.tokens);
  ASSERT_EQ(d.k.size(), c.k.size());
  ASSERT_EQ(d.v.size(), c.v.size());
  EXPECT_EQ(std::memcmp(d.k.data(), c.k.data(), c.k.size()), 0);
  EXPECT_EQ(std::memcmp(d.v.data(), c.v.data(), c.v.size()), 0);
}

TEST(ChunkEntryTest, HeaderFieldsSitAtTheirDocumentedOffsets) {
  const ChunkEntryLayout l = Layout();
  const Chunk c = MakeChunk(l, 2);
  const std::string e = Encode(l, c, 0xAABB, 0xCCDD);
  EXPECT_EQ(e.substr(0, 4), "SKVC");
  EXPECT_EQ(At<uint16_t>(e, 4), kChunkEntryVersion);
  EXPECT_EQ(At<uint16_t>(e, 6), 1);  // float32
  EXPECT_EQ(At<uint64_t>(e, 8), l.fingerprint);
  EXPECT_EQ(At<uint32_t>(e, 16), 3u);
  EXPECT_EQ(At<uint32_t>(e, 20), 2u);
  EXPECT_EQ(At<uint32_t>(e, 24), 4u);
  EXPECT_EQ(At<uint32_t>(e, 28), 5u);
  EXPECT_EQ(At<uint64_t>(e, 32), 0xAABBu);
  EXPECT_EQ(At<uint64_t>(e, 40), 0xCCDDu);
  EXPECT_EQ(At<uint64_t>(e, 48), 2 * l.HalfPayloadBytes());
  EXPECT_EQ(At<uint32_t>(e, 60), 0u);
  EXPECT_EQ(At<int32_t>(e, 64), c.tokens[0]);
  // The checksum covers everything but bytes [56, 64).
  const std::string covered = e.substr(0, 56) + e.substr(64);
  EXPECT_EQ(At<uint32_t>(e, 56), BitwiseCrc32(covered));
}

TEST(ChunkEntryTest, EveryCutEntryIsRefusedAsTruncated) {
  const ChunkEntryLayout l = Layout();
  const std::string e = Encode(l, MakeChunk(l, 3));
  DecodedChunkEntry d;
  for (size_t n = 0; n < e.size(); ++n) {
    EXPECT_EQ(DecodeChunkEntry(std::string_view(e).substr(0, n), l, 42, &d),
              ChunkEntryError::kTruncated)
        << n;
  }
}

TEST(ChunkEntryTest, AFlippedByteIsRefused) {
  const ChunkEntryLayout l = Layout();
  const std::string e = Encode(l, MakeChunk(l, 4));
  DecodedChunkEntry d;
  for (size_t i = 0; i < e.size(); ++i) {
    std::string bad = e;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    const ChunkEntryError error = DecodeChunkEntry(bad, l, 42, &d);
    if (i < 8 || (i >= 16 && i < 32) || (i >= 48 && i < 56) || i >= 60) {
      // Magic, version, dtype, sizes, the zero word: the entry is not of
      // this format or its sizes disagree with its bytes.
      EXPECT_TRUE(error == ChunkEntryError::kFormat || error == ChunkEntryError::kTruncated ||
                  error == ChunkEntryError::kChecksum)
          << i << " " << chunk_entry_error_name(error);
      if (i >= 64) EXPECT_EQ(error, ChunkEntryError::kChecksum) << i;
    } else {
      // Fingerprint, hash, parent, checksum: caught by the checksum.
      EXPECT_EQ(error, ChunkEntryError::kChecksum) << i;
    }
  }
}

TEST(ChunkEntryTest, TrailingBytesBadMagicAndOtherVersionsAreFormatErrors) {
  const ChunkEntryLayout l = Layout();
  const std::string e = Encode(l, MakeChunk(l, 5));
  DecodedChunkEntry d;
  EXPECT_EQ(DecodeChunkEntry(e + "x", l, 42, &d), ChunkEntryError::kFormat);
  std::string magic = e;
  magic[0] = 'X';
  EXPECT_EQ(DecodeChunkEntry(magic, l, 42, &d), ChunkEntryError::kFormat);
  std::string version = e;
  version[4] = static_cast<char>(kChunkEntryVersion + 1);
  EXPECT_EQ(DecodeChunkEntry(version, l, 42, &d), ChunkEntryError::kFormat);
  EXPECT_EQ(DecodeChunkEntry("GET", l, 42, &d), ChunkEntryError::kFormat);
}

TEST(ChunkEntryTest, AnotherModelsOrLayoutsEntryIsRefusedAsWrongModel) {
  const ChunkEntryLayout mine = Layout();
  DecodedChunkEntry d;
  // Intact entries (their checksums hold) written under other settings.
  ChunkEntryLayout other_model = mine;
  other_model.fingerprint ^= 1;
  EXPECT_EQ(DecodeChunkEntry(Encode(other_model, MakeChunk(other_model, 6)), mine, 42, &d),
            ChunkEntryError::kWrongModel);
  ChunkEntryLayout bf16 = mine;
  bf16.dtype = ChunkDtype::kBFloat16;
  EXPECT_EQ(DecodeChunkEntry(Encode(bf16, MakeChunk(bf16, 6)), mine, 42, &d),
            ChunkEntryError::kWrongModel);
  ChunkEntryLayout heads = mine;
  heads.num_kv_heads = 1;
  heads.head_dim = 8;  // same payload bytes, other layout
  EXPECT_EQ(heads.HalfPayloadBytes(), mine.HalfPayloadBytes());
  EXPECT_EQ(DecodeChunkEntry(Encode(heads, MakeChunk(heads, 6)), mine, 42, &d),
            ChunkEntryError::kWrongModel);
  // An entry of another chunk stored under this chunk's key.
  EXPECT_EQ(DecodeChunkEntry(Encode(mine, MakeChunk(mine, 6), 43), mine, 42, &d),
            ChunkEntryError::kWrongModel);
}

TEST(ChunkEntryTest, EncodingRefusesSizesThatAreNotTheLayouts) {
  const ChunkEntryLayout l = Layout();
  Chunk c = MakeChunk(l, 7);
  c.tokens.pop_back();
  EXPECT_TRUE(Encode(l, c).empty());
  c = MakeChunk(l, 7);
  c.v.pop_back();
  EXPECT_TRUE(Encode(l, c).empty());
}

}  // namespace
}  // namespace snapserve::kv

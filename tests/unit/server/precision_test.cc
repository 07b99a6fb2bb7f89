// The precision presets (engine/precision.h) on described hardware, and their
// parsing (server/server_config.cc): which kernel paths each preset picks on
// each CPU family, and that an explicit setting always wins.
#include "engine/precision.h"

#include <gtest/gtest.h>

#include "server/server_config.h"

namespace snapserve::engine {
namespace {

HardwareFacts Avx2Gguf() {
  HardwareFacts hw;
  hw.isa_name = "avx2";
  hw.avx2 = true;
  hw.gguf_blocks = true;
  return hw;
}

HardwareFacts Zen4Gguf() {  // AVX-512 VNNI and AVX512_BF16, no AMX
  HardwareFacts hw = Avx2Gguf();
  hw.isa_name = "avx512vnni";
  hw.avx512 = true;
  hw.int8_panels = true;
  hw.avx512_bf16 = true;
  return hw;
}

HardwareFacts SapphireRapidsGguf() {
  HardwareFacts hw = Zen4Gguf();
  hw.isa_name = "amx";
  hw.amx = true;
  return hw;
}

EngineOptions Resolve(Precision p, const HardwareFacts& hw, PrecisionOverrides o = {},
                      std::string* line = nullptr) {
  EngineOptions options;
  std::string summary = ResolvePrecision(p, o, hw, options);
  if (line != nullptr) *line = summary;
  return options;
}

TEST(PrecisionTest, ExactIsTheEnginesBitExactDefaults) {
  const EngineOptions engine_defaults;
  for (const HardwareFacts& hw : {Avx2Gguf(), Zen4Gguf(), SapphireRapidsGguf()}) {
    const EngineOptions o = Resolve(Precision::kExact, hw);
    EXPECT_EQ(o.linear_precision.dot, QuantDot::kExact);
    EXPECT_EQ(o.linear_precision.prefill, PrefillGemm::kFloat32);
    EXPECT_EQ(o.linear_precision.decode, DecodeDot::kFloat32);
    EXPECT_FALSE(o.kv_cache_dtype.has_value());
    EXPECT_EQ(o.dtype, Dtype::kFloat32);
    EXPECT_EQ(o.block_size, engine_defaults.block_size);
  }
}

TEST(PrecisionTest, AutoPicksEachCpuFamilysFastestPaths) {
  std::string line;
  EngineOptions o = Resolve(Precision::kAuto, Avx2Gguf(), {}, &line);
  EXPECT_EQ(o.linear_precision.dot, QuantDot::kInt8);
  EXPECT_EQ(o.linear_precision.prefill, PrefillGemm::kFloat32);  // bfloat16 would be emulated
  EXPECT_FALSE(o.kv_cache_dtype.has_value());  // an int8 cache is widened below AVX-512
  EXPECT_EQ(o.block_size, 64);
  EXPECT_EQ(line,
            "precision auto: decode int8 dot (avx2), prefill float32, dtype float32, KV float32, "
            "block 64");

  o = Resolve(Precision::kAuto, Zen4Gguf());
  EXPECT_EQ(o.linear_precision.dot, QuantDot::kInt8);
  EXPECT_EQ(o.linear_precision.prefill, PrefillGemm::kInt8);
  EXPECT_EQ(o.kv_cache_dtype, Dtype::kInt8);

  o = Resolve(Precision::kAuto, SapphireRapidsGguf(), {}, &line);
  EXPECT_EQ(o.linear_precision.prefill, PrefillGemm::kBFloat16);
  EXPECT_NE(line.find("prefill bfloat16 (amx)"), std::string::npos) << line;

  // A dense (safetensors) model has no int8 panels: bfloat16 where native.
  HardwareFacts dense = Zen4Gguf();
  dense.gguf_blocks = false;
  EXPECT_EQ(Resolve(Precision::kAuto, dense).linear_precision.prefill, PrefillGemm::kBFloat16);
  HardwareFacts portable;
  o = Resolve(Precision::kAuto, portable);
  EXPECT_EQ(o.linear_precision.dot, QuantDot::kExact);
  EXPECT_FALSE(o.kv_cache_dtype.has_value());
}

TEST(PrecisionTest, Bfloat16WeightsTakeTheBfloat16DotWhereNative) {
  PrecisionOverrides bf16_model;
  bf16_model.dtype = Dtype::kBFloat16;
  EXPECT_EQ(Resolve(Precision::kAuto, Zen4Gguf(), bf16_model).linear_precision.decode,
            DecodeDot::kBFloat16);
  EXPECT_EQ(Resolve(Precision::kAuto, Avx2Gguf(), bf16_model).linear_precision.decode,
            DecodeDot::kFloat32);
  EXPECT_EQ(Resolve(Precision::kAuto, Zen4Gguf()).linear_precision.decode, DecodeDot::kFloat32);
}

TEST(PrecisionTest, ForcedFamilies) {
  EngineOptions o = Resolve(Precision::kInt8, Avx2Gguf());
  EXPECT_EQ(o.linear_precision.dot, QuantDot::kInt8);
  EXPECT_EQ(o.linear_precision.prefill, PrefillGemm::kFloat32);  // no int8 panels without VNNI
  EXPECT_EQ(o.kv_cache_dtype, Dtype::kInt8);
  EXPECT_EQ(Resolve(Precision::kInt8, SapphireRapidsGguf()).linear_precision.prefill,
            PrefillGemm::kInt8);
  o = Resolve(Precision::kBFloat16, Avx2Gguf());
  EXPECT_EQ(o.linear_precision.dot, QuantDot::kExact);
  EXPECT_EQ(o.linear_precision.prefill, PrefillGemm::kBFloat16);
  EXPECT_EQ(o.kv_cache_dtype, Dtype::kBFloat16);
}

TEST(PrecisionTest, ExplicitSettingsWinOverEveryPreset) {
  PrecisionOverrides o;
  o.quantized_dot = QuantDot::kExact;
  o.prefill_gemm = PrefillGemm::kBFloat16;
  o.kv_cache_dtype = Dtype::kFloat16;
  o.block_size = 32;
  o.dtype = Dtype::kFloat16;
  for (Precision p :
       {Precision::kAuto, Precision::kExact, Precision::kInt8, Precision::kBFloat16}) {
    for (bool cuda : {false, true}) {
      HardwareFacts hw = SapphireRapidsGguf();
      hw.cuda = cuda;
      const EngineOptions got = Resolve(p, hw, o);
      EXPECT_EQ(got.linear_precision.dot, QuantDot::kExact) << precision_name(p);
      EXPECT_EQ(got.linear_precision.prefill, PrefillGemm::kBFloat16) << precision_name(p);
      EXPECT_EQ(got.kv_cache_dtype, Dtype::kFloat16) << precision_name(p);
      EXPECT_EQ(got.block_size, 32) << precision_name(p);
      EXPECT_EQ(got.dtype, Dtype::kFloat16) << precision_name(p);
    }
  }
}

TEST(PrecisionTest, CudaComputesInBfloat16UnlessExact) {
  HardwareFacts gpu = SapphireRapidsGguf();
  gpu.cuda = true;
  std::string line;
  EngineOptions o = Resolve(Precision::kAuto, gpu, {}, &line);
  EXPECT_EQ(o.dtype, Dtype::kBFloat16);
  EXPECT_EQ(o.linear_precision.dot, QuantDot::kExact);  // CPU-only paths stay off
  EXPECT_FALSE(o.kv_cache_dtype.has_value());           // int8 entries are CPU-only
  EXPECT_EQ(line, "precision auto: dtype bfloat16, KV bfloat16, block 16");
  EXPECT_EQ(Resolve(Precision::kExact, gpu).dtype, Dtype::kFloat32);
}

}  // namespace
}  // namespace snapserve::engine

namespace snapserve::server {
namespace {

TEST(PrecisionFlagTest, ParsedFromFlagAndEnvironment) {
  ParseResult r = ParseServerConfig({"--precision=exact"});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.precision, engine::Precision::kExact);
  EXPECT_EQ(r.config.engine.linear_precision.dot, engine::QuantDot::kExact);
  EXPECT_EQ(r.config.precision_summary.rfind("precision exact: ", 0), 0u)
      << r.config.precision_summary;
  EXPECT_EQ(ParseServerConfig({}).config.precision, engine::Precision::kAuto);
  ParseResult bad = ParseServerConfig({"--precision=fast"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.message, "--precision: expected one of auto|exact|int8|bf16, got 'fast'");
  // An explicit flag reaches the engine options whatever the preset.
  r = ParseServerConfig({"--precision=int8", "--block-size=8", "--kv-cache-dtype=float32"});
  ASSERT_FALSE(r.exit) << r.message;
  EXPECT_EQ(r.config.engine.block_size, 8);
  EXPECT_EQ(r.config.engine.kv_cache_dtype, engine::Dtype::kFloat32);
  EXPECT_EQ(r.config.engine.linear_precision.dot, engine::QuantDot::kInt8);
}

TEST(PrecisionFlagTest, MarkdownHelpIsOneTableRowPerFlag) {
  const std::string md = ServerHelpMarkdown();
  EXPECT_NE(md.find("| `--precision` | `SNAPSERVE_PRECISION` | `auto` |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `--block-size` | `SNAPSERVE_BLOCK_SIZE` | `from --precision` |"),
            std::string::npos)
      << md;
  // Every flag of the plain help is a row, and '|' inside a cell is escaped.
  const std::string plain = ServerHelp();
  size_t flags = 0;
  for (size_t at = plain.find("\n  --"); at != std::string::npos;
       at = plain.find("\n  --", at + 1)) {
    ++flags;
  }
  size_t rows = 0;
  for (size_t at = md.find("\n| `--"); at != std::string::npos; at = md.find("\n| `--", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows + 1, flags);  // --help itself has no row
  EXPECT_NE(md.find("auto (the fastest this hardware has) \\| exact"), std::string::npos);
}

}  // namespace
}  // namespace snapserve::server

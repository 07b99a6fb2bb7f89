// Checks, operand packing and the parallel loop of kernels/prefill_attention/prefill_attention.h;
// the tile loops are in prefill_attention_cpu_avx512bf16.cc and
// prefill_attention_cpu_amx.cc (bfloat16) and prefill_attention_cpu_avx512.cc
// (float32).
#include "kernels/prefill_attention/prefill_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "kernels/checks.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/parallel_dynamic.h"
#include "kernels/cpu/uninitialized_buffer.h"
#include "kernels/prefill_attention/prefill_attention_cpu_common.h"

namespace snapserve::kernels {

namespace {

using cpu::kTileKeys;
using cpu::UninitializedBuffer;

cpu::AttentionShape ShapeOf(const at::Tensor& q, const at::Tensor& k, int64_t group_rows);

// Checks the shapes and types every kernel takes (prefill_attention.h) and
// that the kernel runs here (`available`, else an error naming what it
// `needs`); returns the sizes, in work items of group_rows(head size) rows.
cpu::AttentionShape CheckedShape(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const char* name, bool (*available)(int64_t), const char* needs,
                                 int64_t (*group_rows)(int64_t)) {
  check_shape(q, "q", {-1, -1, -1});
  const int64_t H = q.size(0), rows = q.size(1), D = q.size(2);
  check_shape(k, "k", {-1, -1, D});
  const int64_t Hkv = k.size(0), keys = k.size(1);
  check_shape(v, "v", {Hkv, keys, D});
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_cpu(), name,
                ": expected float32 CPU tensors");
  }
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, name, ": ", H, " query heads are not a multiple of ", Hkv,
              " KV heads");
  TORCH_CHECK(rows <= keys, name, ": ", rows, " query rows but only ", keys, " keys");
  TORCH_CHECK(available(D), name, ": needs ", needs, ", got head size ", D);
  return ShapeOf(q, k, group_rows(D));
}

// The sizes of checked operands (prefill_attention.h).
cpu::AttentionShape ShapeOf(const at::Tensor& q, const at::Tensor& k, int64_t group_rows) {
  cpu::AttentionShape s;
  s.heads = q.size(0);
  s.rows = q.size(1);
  s.dim = q.size(2);
  s.kv_heads = k.size(0);
  s.keys = k.size(1);
  s.group_rows = group_rows;
  s.rows_padded = (s.rows + group_rows - 1) / group_rows * group_rows;
  s.tiles = (s.keys + kTileKeys - 1) / kTileKeys;
  return s;
}

// t [heads, rows, D] with each row's D floats contiguous: q, k and v are
// usually views of the fused qkv product, contiguous in D, and then not copied.
at::Tensor RowsContiguous(const at::Tensor& t) { return t.stride(2) == 1 ? t : t.contiguous(); }

// The first float of head h's row r in such a tensor.
const float* RowAt(const at::Tensor& t, int64_t h, int64_t r) {
  return t.const_data_ptr<float>() + h * t.stride(0) + r * t.stride(1);
}

// Runs the kernel over every item. Items are head-major and alternate early
// and late rows within a head (prefill_attention.h), so chunks of
// consecutive items cost about the same; threads take them at run time
// (kernels/cpu/parallel_dynamic.h).
template <typename Packed, typename Kernel>
void RunItems(const Packed& p, Kernel kernel, float* out) {
  const int64_t items = p.heads * (p.rows_padded / p.group_rows);
  cpu::parallel_dynamic(items, cpu::chunk_for(items), [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
    kernel(p, begin, end, out);
#else
    (void)kernel, (void)begin, (void)end, (void)out;
#endif
  });
}

}  // namespace

namespace cpu {
int64_t prefill_attention_group_rows(int64_t head_dim) { return 256 / head_dim; }
}  // namespace cpu

namespace {

// Packs q, k and v as both bfloat16 kernels take them (cpu::PackedAttention)
// and runs `kernel` over the work items of `shape`, into out ([rows, H, D])
// or, for the AMX kernel, o_proj_tiles (cpu::PackedAttention).
void AttendBf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                const cpu::AttentionShape& shape,
                void (*kernel)(const cpu::PackedAttention&, int64_t, int64_t, float*), float* out,
                uint16_t* o_proj_tiles) {
  const int64_t H = shape.heads, rows = shape.rows, D = shape.dim, Hkv = shape.kv_heads,
                keys = shape.keys;
  if (rows == 0) return;
  const int64_t rows_padded = shape.rows_padded, tiles = shape.tiles, half = D / 2;
  // Left uninitialized (kernels/cpu/uninitialized_buffer.h): q's padding rows
  // are zeroed below, everything else is written by the packing loops.
  const int64_t tile_k = half * kTileKeys * 2, tile_v = kTileKeys * D;
  UninitializedBuffer<uint32_t> q_pairs(H * rows_padded * half);
  UninitializedBuffer<uint16_t> k_tiles(Hkv * tiles * tile_k);
  UninitializedBuffer<uint16_t> v_pairs(Hkv * tiles * tile_v);
  for (int64_t h = 0; h < H; ++h) {
    std::fill_n(q_pairs.get() + (h * rows_padded + rows) * half, (rows_padded - rows) * half, 0u);
  }
  // Rows are rounded 16 lanes at a time (cpu::round_to_bf16_avx512bf16,
  // cpu::pack_kv_tile_avx512bf16); each row of q, k and v has its last
  // dimension contiguous.
  const at::Tensor qc = RowsContiguous(q), kc = RowsContiguous(k), vc = RowsContiguous(v);
  const auto row = &RowAt;
  const float s = static_cast<float>(scale);
  // Position-major, heads inner: q, k and v are views of the fused qkv
  // product [rows, H + 2 Hkv, D], so this reads it front to back (head-major
  // it took a strided pass per head, 3.4 % of a 2,048-token prefill).
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t h = 0; h < H; ++h) {
        // Pair t of a row is elements 2t and 2t + 1: the row's bf16 in order.
        cpu::round_to_bf16_avx512bf16(
            row(qc, h, r), s,
            reinterpret_cast<uint16_t*>(q_pairs.get() + (h * rows_padded + r) * half), D);
      }
    }
  });
  // k and v a tile of 32 keys at a time, KV heads inner (front to back
  // through the qkv product, as q above). Keys past the last one are
  // written as 0: masked out of the scores, their V rows still meet a weight
  // of 0, and 0 times an uninitialized NaN would be NaN.
  at::parallel_for(0, tiles * Hkv, 4, [&](int64_t begin, int64_t end) {
    for (int64_t tg = begin; tg < end; ++tg) {
      const int64_t tile = tg / Hkv, g = tg % Hkv, key0 = tile * kTileKeys;
      const int64_t at = g * tiles + tile;
      cpu::pack_kv_tile_avx512bf16(row(kc, g, key0), kc.stride(1), row(vc, g, key0), vc.stride(1),
                                   std::min<int64_t>(kTileKeys, keys - key0), D,
                                   k_tiles.get() + at * tile_k, v_pairs.get() + at * tile_v);
    }
  });

  cpu::PackedAttention p;
  static_cast<cpu::AttentionShape&>(p) = shape;
  p.q_pairs = q_pairs.get();
  p.k_tiles = k_tiles.get();
  p.v_pairs = v_pairs.get();
  p.o_proj_tiles = o_proj_tiles;
  RunItems(p, kernel, out);
}

// AttendBf16 into a new [H, rows, D] view of a [rows, H, D] tensor
// (prefill_attention.h).
at::Tensor AttendBf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                      const cpu::AttentionShape& shape,
                      void (*kernel)(const cpu::PackedAttention&, int64_t, int64_t, float*)) {
  at::Tensor out = at::empty({shape.rows, shape.heads, shape.dim}, q.options());
  AttendBf16(q, k, v, scale, shape, kernel, out.data_ptr<float>(), nullptr);
  return out.transpose(0, 1);
}

}  // namespace

bool has_prefill_attention_bf16(int64_t head_dim) {
  return has_avx512_bf16() && (head_dim == 64 || head_dim == 128);
}

at::Tensor prefill_attention_bf16(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scale) {
  const cpu::AttentionShape shape =
      CheckedShape(q, k, v, "prefill_attention_bf16", has_prefill_attention_bf16,
                   "AVX512_BF16 and head size 64 or 128", cpu::prefill_attention_group_rows);
  return AttendBf16(q, k, v, scale, shape, cpu::prefill_attention_avx512bf16);
}

bool has_prefill_attention_amx(int64_t head_dim) { return has_amx_bf16() && head_dim == 64; }

at::Tensor prefill_attention_amx(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale) {
  const cpu::AttentionShape shape = CheckedShape(
      q, k, v, "prefill_attention_amx", has_prefill_attention_amx,
      "AMX tiles (AMX-BF16) and head size 64", [](int64_t) { return cpu::kAmxGroupRows; });
  return AttendBf16(q, k, v, scale, shape, cpu::prefill_attention_amx);
}

AmxPackedRows prefill_attention_amx_packed(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double scale) {
  const cpu::AttentionShape shape = CheckedShape(
      q, k, v, "prefill_attention_amx_packed", has_prefill_attention_amx,
      "AMX tiles (AMX-BF16) and head size 64", [](int64_t) { return cpu::kAmxGroupRows; });
  AmxPackedRows out = empty_amx_packed_rows(shape.rows, shape.heads * shape.dim);
  AttendBf16(q, k, v, scale, shape, cpu::prefill_attention_amx, nullptr,
             static_cast<uint16_t*>(out.tiles.data_ptr()));
  return out;
}

}  // namespace snapserve::kernels

namespace snapserve::kernels {

bool has_prefill_attention_f32(int64_t head_dim) {
  static const bool cpu = cpu_isa() >= CpuIsa::kAvx512;
  return cpu && (head_dim == 64 || head_dim == 128);
}

at::Tensor prefill_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale) {
  const cpu::AttentionShape shape =
      CheckedShape(q, k, v, "prefill_attention_f32", has_prefill_attention_f32,
                   "AVX-512F and head size 64 or 128", cpu::prefill_attention_group_rows);
  const int64_t H = shape.heads, rows = shape.rows, D = shape.dim, Hkv = shape.kv_heads,
                keys = shape.keys;
  at::Tensor out = at::empty({rows, H, D}, q.options()).transpose(0, 1);
  if (rows == 0) return out;
  const int64_t rows_padded = shape.rows_padded, tiles = shape.tiles, tile = kTileKeys * D;
  // Uninitialized but for the padding, as in prefill_attention_bf16.
  UninitializedBuffer<float> qs(H * rows_padded * D);
  UninitializedBuffer<float> k_tiles(Hkv * tiles * tile);
  UninitializedBuffer<float> v_rows(Hkv * tiles * tile);
  for (int64_t h = 0; h < H; ++h) {
    std::fill_n(qs.get() + (h * rows_padded + rows) * D, (rows_padded - rows) * D, 0.0f);
  }
  for (int64_t g = 0; g < Hkv; ++g) {
    std::fill_n(k_tiles.get() + (g * tiles + tiles - 1) * tile, tile, 0.0f);
    std::fill_n(v_rows.get() + (g * tiles + tiles - 1) * tile, tile, 0.0f);
  }
  const at::Tensor qc = RowsContiguous(q), kc = RowsContiguous(k), vc = RowsContiguous(v);
  const auto row = &RowAt;
  const float s = static_cast<float>(scale);
  at::parallel_for(0, H * rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t hr = begin; hr < end; ++hr) {
      const int64_t h = hr / rows, r = hr % rows;
      const float* src = row(qc, h, r);
      float* dst = qs.get() + (h * rows_padded + r) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * s;
    }
  });
  at::parallel_for(0, Hkv * keys, 256, [&](int64_t begin, int64_t end) {
    for (int64_t hk = begin; hk < end; ++hk) {
      const int64_t g = hk / keys, key = hk % keys, t = key / kTileKeys, in = key % kTileKeys;
      const float* ks = row(kc, g, key);
      float* kd = k_tiles.get() + (g * tiles + t) * tile + in;
      for (int64_t d = 0; d < D; ++d) kd[d * kTileKeys] = ks[d];
      std::copy_n(row(vc, g, key), D, v_rows.get() + (g * tiles * kTileKeys + key) * D);
    }
  });

  cpu::PackedAttentionF32 p;
  static_cast<cpu::AttentionShape&>(p) = shape;
  p.q = qs.get();
  p.k_tiles = k_tiles.get();
  p.v_rows = v_rows.get();
  RunItems(p, cpu::prefill_attention_avx512, out.data_ptr<float>());
  return out;
}

}  // namespace snapserve::kernels

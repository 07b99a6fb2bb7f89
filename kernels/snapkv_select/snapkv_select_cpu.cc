// CPU path of snapkv_scores (docs/snapkv.md, steps 2-6), the top-k of
// snapkv_select (step 7) and snapkv_gather. Inputs arrive checked by
// kernels/snapkv_select/snapkv_select.cc.
//
// Every score is computed with plain float32 loops in a fixed order rather than
// with BLAS: a BLAS kernel may round a column differently depending on where it
// falls in a tile, and then two identical keys would no longer tie exactly, so
// "ties keep the lower position" would depend on the matrix size. Each Q·Kᵀ
// entry is the same mul-then-add chain over the head dimension on every path
// (portable; AVX2 and AVX-512 in snapkv_select_cpu_avx2.cc and _avx512.cc; CUDA
// in snapkv_select_cuda.cu), so identical keys always get identical logits.
// The softmax exp and the order of its denominator's sum differ between paths
// by a few ulp; that moves no exact tie (equal logits give equal
// probabilities on any one path).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/snapkv_select/snapkv_select.h"
#include "kernels/snapkv_select/snapkv_select_cpu_simd.h"
#include "kernels/snapkv_select/snapkv_select_scores.h"

namespace snapserve::kernels::detail {

namespace {

// Maps a score to an unsigned key whose order is the float order, with NaN
// below everything and -0 equal to +0, so that top-k is a plain integer
// comparison (the CUDA radix select uses the same mapping).
uint32_t order_key(float s) {
  if (std::isnan(s)) return 0;
  if (s == 0.0f) s = 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &s, sizeof(bits));
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// out[j] += x[j] / divisor. Written as fixed 16-wide blocks on restrict
// pointers so that GCC's -O2 vectorizer (which refuses loops needing alias
// checks or an epilogue) takes it.
void add_divided(const float* __restrict x, float divisor, float* __restrict out, int64_t len) {
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    for (int64_t t = 0; t < 16; ++t) out[j + t] += x[j + t] / divisor;
  }
  for (; j < len; ++j) out[j] += x[j] / divisor;
}

// ---- Q·Kᵀ of the window rows --------------------------------------------
// logits[i][j] = sum over dd in order of q[i][dd] * K[j][dd], each product
// rounded, then added (never fused): the same value on every path here and in
// the CUDA kernel (__fmul_rn / __fadd_rn).
//
// Keys arrive packed in tiles of kTileKeys positions, [n_tiles, d, kTileKeys]
// (zero past n): one tile is 4 KiB at d = 64, read contiguously. A plain
// [d, n] transpose would put a tile's d rows n*4 bytes apart, which for n a
// multiple of 1024 all land in one L1 set and evict each other.
//   q:      [w, d]                    float32
//   packed: [n_tiles, d, kTileKeys]   float32
//   logits: [w, n_tiles * kTileKeys]  output (columns >= n are junk)
// Rows [0, rows) by one key tile, any CPU.
void dot_tile_portable(const float* q, const float* tile, int64_t rows, int64_t d, int64_t stride,
                       float* logits) {
  for (int64_t r = 0; r < rows; ++r) {
    float acc[kTileKeys] = {};
    for (int64_t dd = 0; dd < d; ++dd) {
      const float qv = q[r * d + dd];
      for (int64_t l = 0; l < kTileKeys; ++l) acc[l] += qv * tile[dd * kTileKeys + l];
    }
    std::memcpy(logits + r * stride, acc, sizeof(acc));
  }
}

void window_logits(const float* q, const float* packed, int64_t w, int64_t n_tiles, int64_t d,
                   float* logits) {
  const int64_t stride = n_tiles * kTileKeys;
  const CpuIsa isa = cpu_isa();
  for (int64_t t = 0; t < n_tiles; ++t) {
    const float* tile = packed + t * d * kTileKeys;
    float* out = logits + t * kTileKeys;
    if (isa >= CpuIsa::kAvx512) {
      avx512::dot_rows(q, tile, w, d, stride, out);
    } else if (isa == CpuIsa::kAvx2) {
      avx2::dot_rows(q, tile, w, d, stride, out);
    } else {
      dot_tile_portable(q, tile, w, d, stride, out);
    }
  }
}

// Scales row[0, len) by `scale`, replaces it with exp(x − max) and returns
// their sum (the unnormalized softmax of one window row).
float softmax_numerators(float* row, int64_t len, float scale) {
  if (cpu_isa() != CpuIsa::kPortable) return avx2::softmax_numerators(row, len, scale);
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < len; ++j) {
    row[j] *= scale;
    max_logit = std::max(max_logit, row[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    row[j] = std::exp(row[j] - max_logit);
    sum += row[j];
  }
  return sum;
}

// Steps 3-4 for one query head: score[j] = sum over window rows i of
// softmax(q_i·K/√d)[j] for j < n-w, with row i seeing keys 0 .. n-w+i.
//   q:      [w, d]                    float32
//   packed: [n_tiles, d, kTileKeys]   float32 (the head's KV head, see above)
//   logits: [w, n_tiles * kTileKeys]  scratch
//   score:  [n-w]                     output
void head_scores(const float* q, const float* packed, int64_t w, int64_t n, int64_t d, float scale,
                 float* logits, float* score) {
  const int64_t prefix = n - w;
  const int64_t n_tiles = (n + kTileKeys - 1) / kTileKeys;
  window_logits(q, packed, w, n_tiles, d, logits);
  std::fill(score, score + prefix, 0.0f);
  for (int64_t i = 0; i < w; ++i) {
    float* row = logits + i * n_tiles * kTileKeys;
    const int64_t visible = prefix + i + 1;  // causal inside the window
    const float sum = softmax_numerators(row, visible, scale);
    // Only prefix columns are scored; the window itself is always kept.
    add_divided(row, sum, score, prefix);
  }
}

// Step 5: combines the group's query-head scores into one row.
//   head_scores: [G, len]  ->  out: [len]
void reduce_group(const float* head_scores, int64_t group, int64_t len, GroupReduce reduce,
                  float* out) {
  for (int64_t j = 0; j < len; ++j) {
    float acc = head_scores[j];
    for (int64_t t = 1; t < group; ++t) {
      const float x = head_scores[t * len + j];
      acc = reduce == GroupReduce::kMax ? std::fmax(acc, x) : acc + x;
    }
    out[j] = reduce == GroupReduce::kMax ? acc : acc / static_cast<float>(group);
  }
}

// Step 6: stride 1, padding k/2; avg counts padded positions as 0 (divides by k).
void pool(const float* s, int64_t len, int64_t kernel_size, PoolingKind kind, float* out) {
  const int64_t r = kernel_size / 2;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - r);
    const int64_t hi = std::min<int64_t>(len - 1, j + r);
    if (kind == PoolingKind::kMax) {
      float m = s[lo];
      for (int64_t t = lo + 1; t <= hi; ++t) m = std::fmax(m, s[t]);
      out[j] = m;
    } else {
      float acc = 0.0f;
      for (int64_t t = lo; t <= hi; ++t) acc += s[t];
      out[j] = acc / static_cast<float>(kernel_size);
    }
  }
}

// Step 7: the `top` best prefix positions (ties: lower position), sorted
// increasing, then the window positions. A partial selection, not a sort.
//   pooled: [prefix]  ->  out: [top + w]
void select_positions(const float* pooled, int64_t prefix, int64_t top, int64_t w, int64_t* out) {
  // (score key, inverted position): one descending integer order encodes
  // "higher score first, then lower position"; positions fit 32 bits (checked).
  std::vector<uint64_t> keys(static_cast<size_t>(prefix));
  for (int64_t j = 0; j < prefix; ++j) {
    keys[j] = (static_cast<uint64_t>(order_key(pooled[j])) << 32) |
              (0xFFFFFFFFu - static_cast<uint32_t>(j));
  }
  std::nth_element(keys.begin(), keys.begin() + (top - 1), keys.end(), std::greater<>());
  for (int64_t t = 0; t < top; ++t) {
    out[t] = 0xFFFFFFFFu - static_cast<uint32_t>(keys[t] & 0xFFFFFFFFu);
  }
  std::sort(out, out + top);
  for (int64_t t = 0; t < w; ++t) out[top + t] = prefix + t;
}

}  // namespace

SnapKvScores snapkv_scores_cpu(const at::Tensor& q_window, const at::Tensor& keys,
                               const SnapKvParams& params) {
  const int64_t num_heads = q_window.size(0);
  const int64_t w = q_window.size(1);
  const int64_t d = q_window.size(2);
  const int64_t num_kv_heads = keys.size(0);
  const int64_t n = keys.size(1);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t prefix = n - w;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));

  const at::Tensor q = q_window.to(at::kFloat).contiguous();
  const int64_t n_tiles = (n + kTileKeys - 1) / kTileKeys;
  // [Hkv, n, d] -> zero-padded [Hkv, n_tiles * kTileKeys, d] -> [Hkv, n_tiles, d, kTileKeys]
  const at::Tensor packed =
      at::constant_pad_nd(keys.to(at::kFloat), {0, 0, 0, n_tiles * kTileKeys - n})
          .view({num_kv_heads, n_tiles, kTileKeys, d})
          .transpose(2, 3)
          .contiguous();
  at::Tensor head_score = at::empty({num_heads, prefix}, q.options());
  SnapKvScores scores{at::empty({num_kv_heads, prefix}, q.options()),
                      at::empty({num_kv_heads, prefix}, q.options())};

  const float* q_ptr = q.data_ptr<float>();
  const float* packed_ptr = packed.data_ptr<float>();
  float* hs_ptr = head_score.data_ptr<float>();
  float* raw_ptr = scores.raw.data_ptr<float>();
  float* pooled_ptr = scores.pooled.data_ptr<float>();

  at::parallel_for(0, num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> logits(static_cast<size_t>(w * n_tiles * kTileKeys));
    for (int64_t h = begin; h < end; ++h) {
      head_scores(q_ptr + h * w * d, packed_ptr + (h / group) * n_tiles * d * kTileKeys, w, n, d,
                  scale, logits.data(), hs_ptr + h * prefix);
    }
  });

  at::parallel_for(0, num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      reduce_group(hs_ptr + g * group * prefix, group, prefix, params.group_reduce,
                   raw_ptr + g * prefix);
      pool(raw_ptr + g * prefix, prefix, params.kernel_size, params.pooling,
           pooled_ptr + g * prefix);
    }
  });
  return scores;
}

at::Tensor snapkv_topk_cpu(const at::Tensor& pooled_in, int64_t top, int64_t w) {
  const at::Tensor pooled = pooled_in.contiguous();
  const int64_t num_kv_heads = pooled.size(0);
  const int64_t prefix = pooled.size(1);
  at::Tensor out = at::empty({num_kv_heads, top + w}, pooled.options().dtype(at::kLong));
  const float* pooled_ptr = pooled.data_ptr<float>();
  int64_t* out_ptr = out.data_ptr<int64_t>();
  at::parallel_for(0, num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      select_positions(pooled_ptr + g * prefix, prefix, top, w, out_ptr + g * (top + w));
    }
  });
  return out;
}

at::Tensor snapkv_gather_cpu(const at::Tensor& src_in, const at::Tensor& indices_in) {
  const at::Tensor src = src_in.stride(2) == 1 ? src_in : src_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const int64_t num_kv_heads = src.size(0);
  const int64_t n = src.size(1);
  const int64_t d = src.size(2);
  const int64_t kept = indices.size(1);
  const int64_t* idx = indices.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_kv_heads * kept; ++t) {
    TORCH_CHECK(idx[t] >= 0 && idx[t] < n, "indices: position ", idx[t], " at [", t / kept, ", ",
                t % kept, "] is outside [0, ", n, ")");
  }

  at::Tensor out = at::empty({num_kv_heads, kept, d}, src.options());
  const auto elem = static_cast<int64_t>(src.element_size());
  const char* base = static_cast<const char*>(src.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const int64_t head_stride = src.stride(0) * elem;
  const int64_t pos_stride = src.stride(1) * elem;
  const int64_t row_bytes = d * elem;
  at::parallel_for(0, num_kv_heads * kept, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(dst + t * row_bytes, base + (t / kept) * head_stride + idx[t] * pos_stride,
                  static_cast<size_t>(row_bytes));
    }
  });
  return out;
}

}  // namespace snapserve::kernels::detail

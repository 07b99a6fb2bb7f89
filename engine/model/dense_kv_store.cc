#include "engine/model/dense_kv_store.h"

#include <algorithm>
#include <cmath>

namespace snapserve::model {

DenseKvStore::DenseKvStore(int64_t num_layers, int64_t sliding_window)
    : num_layers_(num_layers), sliding_window_(sliding_window) {}

void DenseKvStore::Append(LayerCache& c, const at::Tensor& k, const at::Tensor& v) {
  const int64_t m = k.size(1);
  const int64_t capacity = c.k.defined() ? c.k.size(1) : 0;
  if (c.length + m > capacity) {
    // Doubling keeps decode appends amortized O(1) instead of a cat per step.
    const int64_t new_capacity = std::max<int64_t>({16, 2 * capacity, c.length + m});
    at::Tensor nk = at::empty({k.size(0), new_capacity, k.size(2)}, k.options());
    at::Tensor nv = at::empty({v.size(0), new_capacity, v.size(2)}, v.options());
    if (c.length > 0) {
      nk.narrow(1, 0, c.length).copy_(c.k.narrow(1, 0, c.length));
      nv.narrow(1, 0, c.length).copy_(c.v.narrow(1, 0, c.length));
    }
    c.k = nk;
    c.v = nv;
  }
  c.k.narrow(1, c.length, m).copy_(k);
  c.v.narrow(1, c.length, m).copy_(v);
  c.length += m;
}

void DenseKvStore::StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& /*q*/,
                                     const at::Tensor& k, const at::Tensor& v) {
  auto& layers = seqs_[seq];
  if (layers.empty()) layers.resize(num_layers_);
  TORCH_CHECK(layer >= 0 && layer < num_layers_, "DenseKvStore: layer out of range");
  layers[layer] = LayerCache{};  // a new prompt replaces whatever was there
  Append(layers[layer], k, v);
}

at::Tensor DenseKvStore::DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer,
                                         const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v) {
  const int64_t batch = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k.size(1);
  const int64_t group = num_heads / num_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor out = at::empty_like(q);
  for (int64_t b = 0; b < batch; ++b) {
    auto& layers = seqs_[seqs[b]];
    if (layers.empty()) layers.resize(num_layers_);
    LayerCache& c = layers[layer];
    Append(c, k[b].unsqueeze(1), v[b].unsqueeze(1));
    int64_t start = 0, len = c.length;
    if (sliding_window_ > 0 && len > sliding_window_) {
      start = len - sliding_window_;
      len = sliding_window_;
    }
    at::Tensor keys = c.k.narrow(1, start, len);    // [Hkv, L, D]
    at::Tensor values = c.v.narrow(1, start, len);  // [Hkv, L, D]
    // Query heads of one KV head side by side: no K/V repetition for GQA.
    at::Tensor qg = q[b].view({num_kv_heads, group, head_dim});
    at::Tensor scores = at::matmul(qg, keys.transpose(1, 2)).to(at::kFloat) * scale;
    at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());  // [Hkv, G, L]
    out[b].copy_(at::matmul(probs, values).view({num_heads, head_dim}));
  }
  return out;
}

int64_t DenseKvStore::Length(int64_t seq, int64_t layer) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || layer < 0 || layer >= static_cast<int64_t>(it->second.size())) return 0;
  return it->second[layer].length;
}

std::pair<at::Tensor, at::Tensor> DenseKvStore::Entries(int64_t seq, int64_t layer) const {
  const LayerCache& c = seqs_.at(seq).at(layer);
  return {c.k.narrow(1, 0, c.length), c.v.narrow(1, 0, c.length)};
}

void DenseKvStore::Drop(int64_t seq) { seqs_.erase(seq); }

}  // namespace snapserve::model

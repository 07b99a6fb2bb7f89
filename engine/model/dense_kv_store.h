// DenseKvStore: the simplest KvStore. Keeps every prompt and generated entry
// of every sequence in contiguous per-(sequence, layer) tensors that grow by
// doubling. For tests, tools and the parity benchmarks; the serving engine
// uses the paged cache (engine/kv/) instead.
//
// Sliding window (Mistral): decode attends over the last `sliding_window`
// entries only. That is exact here because this store keeps every entry, so
// cache index == absolute position.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "engine/model/kv_store.h"

namespace snapserve::model {

class DenseKvStore : public KvStore {
 public:
  // sliding_window 0: attend over everything.
  DenseKvStore(int64_t num_layers, int64_t sliding_window = 0);

  void StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v) override;
  at::Tensor DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v) override;

  // Entries cached for `seq` at `layer` (0 if unknown).
  int64_t Length(int64_t seq, int64_t layer) const;
  // The cached k/v [num_kv_heads, Length, head_dim] (views; for tests).
  std::pair<at::Tensor, at::Tensor> Entries(int64_t seq, int64_t layer) const;
  // Frees everything cached for `seq`.
  void Drop(int64_t seq);

 private:
  struct LayerCache {
    at::Tensor k;  // [num_kv_heads, capacity, head_dim]
    at::Tensor v;
    int64_t length = 0;
  };
  void Append(LayerCache& c, const at::Tensor& k, const at::Tensor& v);  // k/v [Hkv, m, D]

  int64_t num_layers_;
  int64_t sliding_window_;
  std::map<int64_t, std::vector<LayerCache>> seqs_;
};

}  // namespace snapserve::model

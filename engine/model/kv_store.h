// KvStore: the one seam between the forward pass (llama_model.h) and a KV
// cache. The model computes post-RoPE q/k/v and hands them over; the store
// decides what to keep (everything, or a SnapKV selection, docs/snapkv.md) and
// how to attend over it during decoding (dense tensors, paged blocks, CPU or
// CUDA kernels). The model never holds K/V across calls.
//
// Threading: a store is driven by one thread (the scheduler's); no locking.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace snapserve::model {

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Prefill of one sequence: called once per layer, in layer order, right
  // after that layer's attention over the whole prompt, with post-RoPE
  //   q [num_heads, n, head_dim], k [num_kv_heads, n, head_dim],
  //   v [num_kv_heads, n, head_dim]
  // for prompt positions 0..n-1. The store keeps what it wants (copies it:
  // the tensors may be views of a buffer the model reuses); the model drops
  // its full K/V afterwards, so only one layer's full K/V is alive at a time.
  virtual void StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v) = 0;

  // Decode, one step for a batch of B sequences (`seqs[b]` each): append this
  // step's k/v [B, num_kv_heads, head_dim] to each sequence's cache, then
  // return the attention output [B, num_heads, head_dim] (q's dtype) of
  // q [B, num_heads, head_dim] over each sequence's cached entries, the new
  // one included. Scale 1/sqrt(head_dim); heads share KV heads in groups of
  // num_heads / num_kv_heads (GQA: query head h reads KV head h / group).
  virtual at::Tensor DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer,
                                     const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) = 0;
};

}  // namespace snapserve::model

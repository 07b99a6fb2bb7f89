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

  // Prefill of one sequence: called once per layer, in layer order, once
  // that layer's attention over the whole prompt has run, with post-RoPE
  //   q [num_heads, r, head_dim] (the prompt's last r <= n queries; r = n
  //   when the prompt ran in one chunk), k [num_kv_heads, n, head_dim],
  //   v [num_kv_heads, n, head_dim]
  // for prompt positions 0..n-1. The store keeps what it wants (copies it:
  // the tensors may be views of a buffer the model reuses); the model drops
  // its full K/V afterwards.
  virtual void StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v) = 0;

  // A decode step is explicit: BeginDecodeStep(seqs), then DecodeAttention
  // for layers 0..L-1 in order with the same `seqs`, then EndDecodeStep, which
  // commits the step's new entries (every layer of a step attends over the
  // same context length). A step abandoned midway (an exception) commits
  // nothing; the next BeginDecodeStep replaces it.
  virtual void BeginDecodeStep(const std::vector<int64_t>& /*seqs*/) {}
  virtual void EndDecodeStep() {}

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

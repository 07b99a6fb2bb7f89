// Exposes the paged KV kernels to pytest as torch.ops.snapserve.* so the
// Python tests can check them against dense torch references.
#include <torch/library.h>

#include "kernels/kv_append/kv_append.h"
#include "kernels/paged_attention/paged_attention.h"

namespace {

at::Tensor paged_decode_attention_op(const at::Tensor& q, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, const at::Tensor& block_tables,
                                     const at::Tensor& context_lens, double scale) {
  return snapserve::kernels::paged_decode_attention(q, key_cache, value_cache, block_tables,
                                                    context_lens, scale);
}

// An int8 cache (kernels/kv_append/kv_append.h) with its scales.
at::Tensor paged_decode_attention_int8_op(const at::Tensor& q, const at::Tensor& key_cache,
                                          const at::Tensor& key_scales,
                                          const at::Tensor& value_cache,
                                          const at::Tensor& value_scales,
                                          const at::Tensor& block_tables,
                                          const at::Tensor& context_lens, double scale) {
  return snapserve::kernels::paged_decode_attention(q, key_cache, value_cache, block_tables,
                                                    context_lens, scale, key_scales, value_scales);
}

void kv_append_int8_op(at::Tensor key_cache, at::Tensor key_scales, at::Tensor value_cache,
                       at::Tensor value_scales, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& slot_mapping) {
  snapserve::kernels::kv_append_int8(key_cache, key_scales, value_cache, value_scales, k, v,
                                     slot_mapping);
}

// Mutates the caches in place, as the schema's (a!) annotations declare.
void kv_append_op(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& slot_mapping) {
  snapserve::kernels::kv_append(key_cache, value_cache, k, v, slot_mapping);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor context_lens, float scale) -> Tensor");
  m.def(
      "kv_append(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor k, Tensor v, "
      "Tensor slot_mapping) -> ()");
  m.impl("paged_decode_attention", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(paged_decode_attention_op));
  m.impl("kv_append", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(kv_append_op));
  m.def(
      "paged_decode_attention_int8(Tensor q, Tensor key_cache, Tensor key_scales, "
      "Tensor value_cache, Tensor value_scales, Tensor block_tables, Tensor context_lens, "
      "float scale) -> Tensor");
  m.def(
      "kv_append_int8(Tensor(a!) key_cache, Tensor(b!) key_scales, Tensor(c!) value_cache, "
      "Tensor(d!) value_scales, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
  m.impl("paged_decode_attention_int8", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(paged_decode_attention_int8_op));
  m.impl("kv_append_int8", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(kv_append_int8_op));
}

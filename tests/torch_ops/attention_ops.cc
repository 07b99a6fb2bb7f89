// Exposes the prompt attention kernels (kernels/prefill_attention.h) as
// torch.ops.snapserve.prefill_attention_bf16, prefill_attention_amx and
// prefill_attention_f32, for
// bench/attention_kernels.py
// (its time alone, without the model around it) and for pytest.
#include <torch/library.h>

#include "kernels/prefill_attention.h"

namespace {

at::Tensor prefill_attention_bf16_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     double scale) {
  TORCH_CHECK(snapserve::kernels::has_prefill_attention_bf16(q.size(-1)),
              "prefill_attention_bf16: no AVX512_BF16 path on this CPU for head_dim ", q.size(-1));
  return snapserve::kernels::prefill_attention_bf16(q, k, v, scale);
}

at::Tensor prefill_attention_f32_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    double scale) {
  TORCH_CHECK(snapserve::kernels::has_prefill_attention_f32(q.size(-1)),
              "prefill_attention_f32: no AVX-512F path on this CPU for head_dim ", q.size(-1));
  return snapserve::kernels::prefill_attention_f32(q, k, v, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("prefill_attention_bf16(Tensor q, Tensor k, Tensor v, float scale) -> Tensor",
        &prefill_attention_bf16_op);
  // The kernel itself refuses a CPU without AMX, naming what it needs.
  m.def("prefill_attention_amx(Tensor q, Tensor k, Tensor v, float scale) -> Tensor",
        &snapserve::kernels::prefill_attention_amx);
  m.def("prefill_attention_f32(Tensor q, Tensor k, Tensor v, float scale) -> Tensor",
        &prefill_attention_f32_op);
}

// Exposes the prompt attention kernels (kernels/prefill_attention/prefill_attention.h) as
// torch.ops.snapserve.prefill_attention_bf16, prefill_attention_amx and
// prefill_attention_f32 (and the AMX one followed by o_proj), for
// bench/attention_kernels.py
// (its time alone, without the model around it) and for pytest.
#include <torch/library.h>

#include "kernels/prefill_attention/prefill_attention.h"

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

// h += o_proj(prefill_attention_amx(q, k, v, scale)) on AMX tiles, o_proj's
// input either the attention's float32 output packed by the GEMM or its
// tiles written by the attention (prefill_attention_amx_packed), for
// bench/prefill_gemm.py. w: pack_amx_weight's o_proj.
at::Tensor attention_o_proj_amx_op(at::Tensor h, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, double scale, const at::Tensor& w,
                                   bool tiles) {
  namespace kn = snapserve::kernels;
  if (tiles) {
    kn::linear_amx_add_(h, kn::prefill_attention_amx_packed(q, k, v, scale), w);
  } else {
    const at::Tensor attn = kn::prefill_attention_amx(q, k, v, scale);  // [H, rows, D]
    kn::linear_amx_add_(h, attn.transpose(0, 1).reshape({q.size(1), -1}), w);
  }
  return h;
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
  m.def(
      "attention_o_proj_amx(Tensor(a!) h, Tensor q, Tensor k, Tensor v, float scale, Tensor w, "
      "bool tiles) -> Tensor(a!)",
      &attention_o_proj_amx_op);
}

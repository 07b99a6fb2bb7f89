// Exposes the fused CUDA kernels (kernels/fused/fused_cuda.h) to pytest as
// torch.ops.snapserve.cuda_*, so tests/python/test_cuda_fused_kernels.py can
// check them against float64 references. Outputs are arguments: the tests fill
// them with NaN first, so an element a kernel forgets to write fails.
// Registered without a dispatch key, like snapkv_ops.cc: the functions check
// devices themselves (CUDA only; a build without CUDA throws).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>

#include "kernels/fused/fused_cuda.h"

namespace {

void rms_norm_add_op(at::Tensor residual, const std::optional<at::Tensor>& delta,
                     const at::Tensor& weight, double eps, at::Tensor out) {
  snapserve::kernels::rms_norm_add_cuda_(residual, delta.value_or(at::Tensor()), weight, eps, out);
}

void rope_qk_op(at::Tensor x, const at::Tensor& positions, const at::Tensor& inv_freq) {
  snapserve::kernels::rope_qk_cuda_(x, positions, inv_freq);
}

void silu_mul_op(const at::Tensor& gate_up, at::Tensor out) {
  snapserve::kernels::silu_mul_cuda_out(gate_up, out);
}

void kv_append_lanes_op(at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& slots) {
  snapserve::kernels::kv_append_lanes_cuda(key_cache, value_cache, k, v, slots);
}

int64_t split_decode_attention_op(at::Tensor out, const at::Tensor& q, const at::Tensor& key_cache,
                                  const at::Tensor& value_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale,
                                  int64_t partition_size) {
  return snapserve::kernels::split_decode_attention_cuda(
      out, q, key_cache, value_cache, block_tables, context_lens, scale, partition_size);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "cuda_rms_norm_add_(Tensor(a!) residual, Tensor? delta, Tensor weight, float eps, "
      "Tensor(b!) out) -> ()",
      &rms_norm_add_op);
  m.def("cuda_rope_qk_(Tensor(a!) x, Tensor positions, Tensor inv_freq) -> ()", &rope_qk_op);
  m.def("cuda_silu_mul_out(Tensor gate_up, Tensor(a!) out) -> ()", &silu_mul_op);
  m.def(
      "cuda_kv_append_lanes(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor k, Tensor v, "
      "Tensor slots) -> ()",
      &kv_append_lanes_op);
  m.def(
      "cuda_split_decode_attention(Tensor(a!) out, Tensor q, Tensor key_cache, "
      "Tensor value_cache, Tensor block_tables, Tensor context_lens, float scale, "
      "int partition_size) -> int",
      &split_decode_attention_op);
}

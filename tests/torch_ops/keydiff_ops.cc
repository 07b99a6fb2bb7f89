// Exposes the engine's KeyDiff selector to pytest:
// torch.ops.snapserve.keydiff_select runs the very KvSelector the server
// installs for a KeyDiff request (engine/compress/keydiff_selector.h), so what
// it keeps can be compared with kvpress's KeyDiffPress.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>

#include "engine/compress/keydiff_selector.h"

namespace {

// k, v [num_kv_heads, n, head_dim] of one layer -> the kept (k, v).
std::tuple<at::Tensor, at::Tensor> keydiff_select_op(const at::Tensor& keys,
                                                     const at::Tensor& values, int64_t capacity) {
  snapserve::engine::KvCompressionConfig config;
  config.method = snapserve::engine::KvMethod::kKeyDiff;
  config.capacity = capacity;
  const snapserve::kv::KeptKv kept = snapserve::compress::MakeKeyDiffSelector(config)(
      /*layer=*/0, /*q=*/at::Tensor(), keys, values);
  return {kept.k, kept.v};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("keydiff_select(Tensor keys, Tensor values, int capacity) -> (Tensor, Tensor)",
        &keydiff_select_op);
}

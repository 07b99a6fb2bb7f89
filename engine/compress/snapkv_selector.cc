#include "engine/compress/snapkv_selector.h"

#include <ATen/ATen.h>

#include <chrono>

#include "kernels/snapkv_select.h"

namespace snapserve::compress {

kv::KvSelector MakeSnapKvSelector(const KvCompressionConfig& config,
                                  std::shared_ptr<SelectionTimer> timer) {
  const kernels::SnapKvParams params = ToSnapKvParams(config);
  return [params, timer](int64_t /*layer*/, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v) {
    const auto start = std::chrono::steady_clock::now();
    // q [num_heads, r, d] holds the prompt's last r >= w queries (kv_store.h):
    // the observation window is its last w rows.
    const at::Tensor q_window = q.narrow(1, q.size(1) - params.window, params.window);
    const at::Tensor keep = kernels::snapkv_select(q_window, k, params);  // [G, C]
    std::pair<at::Tensor, at::Tensor> kept{kernels::snapkv_gather(k, keep),
                                           kernels::snapkv_gather(v, keep)};
    if (timer) {
      timer->seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return kept;
  };
}

}  // namespace snapserve::compress

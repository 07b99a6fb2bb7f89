// Internal to the CPU kernels of GGUF's 32-element block types (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, often called the legacy types): one switch from a runtime
// QuantType to a kernel instantiated per type, instead of the same
// switch written out in every SIMD file.
//
//   return with_block32_type<kAllBlock32Types>(w.type, [&]<QuantType kType>() {
//     rows_dot<kType>(w, xq, r_begin, r_end, out, n_total);
//   });
//
// The lambda is called with the type as a template argument when `type` is
// one of kTypes; returns whether it was (false: a type the family lacks).
#pragma once

#include "kernels/quant/quant_blocks.h"

namespace snapserve::kernels {

// Which 32-element block types a kernel family instantiates.
struct Block32Types {
  bool q4_0 = false, q4_1 = false, q5_0 = false, q5_1 = false, q8_0 = false;
};
inline constexpr Block32Types kAllBlock32Types{true, true, true, true, true};
inline constexpr Block32Types kFusedDecodeTypes{.q4_0 = true, .q4_1 = true, .q8_0 = true};

template <Block32Types kTypes, typename F>
bool with_block32_type(QuantType type, F&& kernel) {
  switch (type) {
    case QuantType::kQ4_0:
      if constexpr (kTypes.q4_0) {
        kernel.template operator()<QuantType::kQ4_0>();
        return true;
      }
      break;
    case QuantType::kQ4_1:
      if constexpr (kTypes.q4_1) {
        kernel.template operator()<QuantType::kQ4_1>();
        return true;
      }
      break;
    case QuantType::kQ5_0:
      if constexpr (kTypes.q5_0) {
        kernel.template operator()<QuantType::kQ5_0>();
        return true;
      }
      break;
    case QuantType::kQ5_1:
      if constexpr (kTypes.q5_1) {
        kernel.template operator()<QuantType::kQ5_1>();
        return true;
      }
      break;
    case QuantType::kQ8_0:
      if constexpr (kTypes.q8_0) {
        kernel.template operator()<QuantType::kQ8_0>();
        return true;
      }
      break;
    default:
      break;
  }
  return false;
}

}  // namespace snapserve::kernels

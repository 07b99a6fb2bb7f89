#include "engine/model/gguf_tensor_plan.h"

#include <set>

#include "kernels/quant/quant_blocks.h"

namespace snapserve::model {
namespace {

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

bool IsFloatType(uint32_t type) {
  return type == static_cast<uint32_t>(GgufType::kF32) ||
         type == static_cast<uint32_t>(GgufType::kF16) ||
         type == static_cast<uint32_t>(GgufType::kBF16);
}

bool RoleAccepts(GgufTensorRole role, uint32_t type) {
  if (IsFloatType(type)) return true;
  return role == GgufTensorRole::kMatrix && kernels::quant_type_from_ggml(type).has_value();
}

}  // namespace

std::vector<ExpectedGgufTensor> ExpectedGgufTensors(const ModelConfig& c) {
  const int64_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
  const auto matrix = GgufTensorRole::kMatrix;
  const auto vector = GgufTensorRole::kVector;
  // PyTorch's [rows, cols] is GGUF's {cols, rows}.
  std::vector<ExpectedGgufTensor> out = {
      {"token_embd.weight", {c.hidden, c.vocab}, matrix, true},
      {"output_norm.weight", {c.hidden}, vector, true},
      {"output.weight", {c.hidden, c.vocab}, matrix, false},
      {"rope_freqs.weight", {c.head_dim / 2}, vector, false},
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    out.push_back({p + "attn_norm.weight", {c.hidden}, vector, true});
    out.push_back({p + "attn_q.weight", {c.hidden, q_rows}, matrix, true});
    out.push_back({p + "attn_k.weight", {c.hidden, kv_rows}, matrix, true});
    out.push_back({p + "attn_v.weight", {c.hidden, kv_rows}, matrix, true});
    out.push_back({p + "attn_output.weight", {q_rows, c.hidden}, matrix, true});
    out.push_back({p + "ffn_norm.weight", {c.hidden}, vector, true});
    out.push_back({p + "ffn_gate.weight", {c.hidden, c.intermediate}, matrix, true});
    out.push_back({p + "ffn_up.weight", {c.hidden, c.intermediate}, matrix, true});
    out.push_back({p + "ffn_down.weight", {c.intermediate, c.hidden}, matrix, true});
  }
  return out;
}

Status CheckGgufTensorTable(const GgufFile& file, const ModelConfig& config) {
  const auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(file.path() + ": " + what);
  };
  std::set<std::string, std::less<>> expected_names;
  for (const ExpectedGgufTensor& want : ExpectedGgufTensors(config)) {
    expected_names.insert(want.name);
    const GgufTensorInfo* t = file.FindTensor(want.name);
    if (t == nullptr) {
      if (!want.required) continue;
      return bad("tensor '" + want.name + "' is missing (the metadata describes " +
                 std::to_string(config.num_layers) + " layers)");
    }
    if (t->dims != want.dims) {
      return bad("tensor '" + want.name + "' has shape " + DimsString(t->dims) +
                 ", the metadata implies " + DimsString(want.dims));
    }
    if (!RoleAccepts(want.role, t->type)) {
      return bad("tensor '" + want.name + "' has type " + GgufTypeName(t->type) +
                 (want.role == GgufTensorRole::kVector
                      ? ", expected F32, F16 or BF16"
                      : ", which the loader does not decode (F32, F16, BF16, Q4_0, Q4_1, "
                        "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K are)"));
    }
  }
  // A tensor nobody reads is a file that does not match its own metadata
  // (layers beyond block_count, a renamed or foreign tensor).
  for (const GgufTensorInfo& t : file.tensors()) {
    if (expected_names.count(t.name) == 0) {
      return bad("tensor '" + ShownName(t.name) + "' is not part of a " + config.architecture +
                 " model with " + std::to_string(config.num_layers) +
                 " layers (an unknown tensor, or the metadata's block_count is wrong)");
    }
  }
  return Status::Ok();
}

}  // namespace snapserve::model

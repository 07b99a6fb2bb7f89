#include "engine/model/weights.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model/safetensors.h"

namespace snapserve::model {
namespace {

at::ScalarType ToScalarType(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::kF32:
      return at::kFloat;
    case SafetensorsDtype::kF16:
      return at::kHalf;
    case SafetensorsDtype::kBF16:
      return at::kBFloat16;
  }
  return at::kFloat;
}

std::string ShapeString(at::IntArrayRef shape) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < shape.size(); ++i) o << (i ? ", " : "") << shape[i];
  o << "]";
  return o.str();
}

class HfWeightSource : public WeightSource {
 public:
  explicit HfWeightSource(std::string dir) : dir_(std::move(dir)) {}

  Status AddFile(const std::string& file_name) {
    if (file_name.find('/') != std::string::npos || file_name == ".." || file_name.empty()) {
      return Status::InvalidArgument(dir_ + ": shard name `" + file_name +
                                     "` must be a plain "
                                     "file name inside the model directory");
    }
    if (file_index_.count(file_name)) return Status::Ok();
    auto file = SafetensorsFile::Open(dir_ + "/" + file_name);
    if (!file.ok()) return file.status();
    file_index_[file_name] = files_.size();
    for (const auto& t : (*file)->tensors()) owner_[t.name] = files_.size();
    files_.push_back(std::move(file).value());
    return Status::Ok();
  }

  bool Has(const std::string& hf_name) const override { return owner_.count(hf_name) > 0; }

  std::string Where(const std::string& hf_name) const override {
    auto it = owner_.find(hf_name);
    return it == owner_.end() ? dir_ : files_[it->second]->path();
  }

  StatusOr<at::Tensor> Load(const std::string& hf_name, at::ScalarType dtype,
                            at::Device device) override {
    auto it = owner_.find(hf_name);
    if (it == owner_.end()) {
      return Status::NotFound(dir_ + ": tensor `" + hf_name +
                              "` not found in any safetensors file");
    }
    const SafetensorsTensor* t = files_[it->second]->Find(hf_name);
    try {
      // from_blob aliases the read-only mapping; the copy below detaches it.
      at::Tensor view = at::from_blob(const_cast<uint8_t*>(t->data), t->shape,
                                      at::TensorOptions().dtype(ToScalarType(t->dtype)));
      return view.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
    } catch (const c10::Error& e) {
      return Status::Internal(Where(hf_name) + ": tensor `" + hf_name +
                              "`: conversion failed: " + e.what_without_backtrace());
    }
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_index_;
  std::map<std::string, size_t> owner_;
};

// Loads one tensor and checks its shape against what the config implies.
class Loader {
 public:
  Loader(WeightSource& source, at::ScalarType dtype, at::Device device, int64_t total,
         const LogFn& log)
      : source_(source), dtype_(dtype), device_(device), total_(total), log_(log) {}

  StatusOr<at::Tensor> Get(const std::string& name, std::vector<int64_t> shape) {
    auto t = source_.Load(name, dtype_, device_);
    if (!t.ok()) return t.status();
    if (t->sizes() != at::IntArrayRef(shape)) {
      return Status::InvalidArgument(source_.Where(name) + ": tensor `" + name + "` has shape " +
                                     ShapeString(t->sizes()) + ", the config implies " +
                                     ShapeString(shape));
    }
    ++done_;
    // About ten progress lines per load, whatever the model size.
    if (log_ && (done_ == total_ || done_ * 10 / total_ != (done_ - 1) * 10 / total_)) {
      log_("loaded " + std::to_string(done_) + "/" + std::to_string(total_) + " tensors");
    }
    return t;
  }

 private:
  WeightSource& source_;
  at::ScalarType dtype_;
  at::Device device_;
  int64_t total_;
  int64_t done_ = 0;
  const LogFn& log_;
};

}  // namespace

void LogToStderr(const std::string& line) {
  std::fprintf(stderr, "[snapserve.model] %s\n", line.c_str());
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

StatusOr<LlamaWeights> AssembleWeights(const ModelConfig& c, WeightSource& source,
                                       at::ScalarType dtype, at::Device device, const LogFn& log) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t total = 2 + 9 * c.num_layers + (c.tie_word_embeddings ? 0 : 1);
  Loader loader(source, dtype, device, total, log);
  LlamaWeights w;
  const int64_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;

  try {
    SNAPSERVE_ASSIGN_OR_RETURN(w.embed,
                               loader.Get("model.embed_tokens.weight", {c.vocab, c.hidden}));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LayerWeights l;
      at::Tensor q, k, v, gate, up;
      SNAPSERVE_ASSIGN_OR_RETURN(l.attn_norm, loader.Get(p + "input_layernorm.weight", {c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(q, loader.Get(p + "self_attn.q_proj.weight", {q_rows, c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(k, loader.Get(p + "self_attn.k_proj.weight", {kv_rows, c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(v, loader.Get(p + "self_attn.v_proj.weight", {kv_rows, c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(l.o_proj,
                                 loader.Get(p + "self_attn.o_proj.weight", {c.hidden, q_rows}));
      SNAPSERVE_ASSIGN_OR_RETURN(l.mlp_norm,
                                 loader.Get(p + "post_attention_layernorm.weight", {c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(
          gate, loader.Get(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(up,
                                 loader.Get(p + "mlp.up_proj.weight", {c.intermediate, c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(
          l.down, loader.Get(p + "mlp.down_proj.weight", {c.hidden, c.intermediate}));
      l.qkv = at::cat({q, k, v}, 0);
      l.gate_up = at::cat({gate, up}, 0);
      w.layers.push_back(std::move(l));
    }
    SNAPSERVE_ASSIGN_OR_RETURN(w.final_norm, loader.Get("model.norm.weight", {c.hidden}));
    if (c.tie_word_embeddings) {
      w.lm_head = w.embed;
    } else {
      SNAPSERVE_ASSIGN_OR_RETURN(w.lm_head, loader.Get("lm_head.weight", {c.vocab, c.hidden}));
    }
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("assembling weights failed: ") +
                            e.what_without_backtrace());
  }

  if (log) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[160];
    std::snprintf(line, sizeof(line), "weights loaded in %.2f s; resident memory %.1f MiB", secs,
                  static_cast<double>(ResidentBytes()) / (1 << 20));
    log(line);
  }
  return w;
}

StatusOr<std::unique_ptr<WeightSource>> OpenHfWeights(const std::string& dir) {
  auto source = std::make_unique<HfWeightSource>(dir);
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream index(index_path, std::ios::binary);
  if (!index) {
    SNAPSERVE_RETURN_IF_ERROR(source->AddFile("model.safetensors"));
    return std::unique_ptr<WeightSource>(std::move(source));
  }
  std::ostringstream text;
  text << index.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object()) {
    return Status::InvalidArgument(index_path + ": needs a `weight_map` object");
  }
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      return Status::InvalidArgument(index_path + ": weight_map[`" + name + "`] is not a string");
    }
    SNAPSERVE_RETURN_IF_ERROR(source->AddFile(file.get<std::string>()));
    if (!source->Has(name)) {
      return Status::InvalidArgument(index_path + ": tensor `" + name + "` is not in " + dir + "/" +
                                     file.get<std::string>());
    }
  }
  return std::unique_ptr<WeightSource>(std::move(source));
}

}  // namespace snapserve::model

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
    SNAPSERVE_RETURN_IF_ERROR(CheckShape(name, t->sizes().vec(), shape));
    Progress();
    return t;
  }

  StatusOr<LinearWeight> GetLinear(const std::string& name, int64_t rows, int64_t cols) {
    auto w = source_.LoadLinear(name, dtype_, device_);
    if (!w.ok()) return w.status();
    SNAPSERVE_RETURN_IF_ERROR(CheckShape(name, {w->rows(), w->cols()}, {rows, cols}));
    Progress();
    return w;
  }

 private:
  Status CheckShape(const std::string& name, const std::vector<int64_t>& got,
                    const std::vector<int64_t>& want) const {
    if (got == want) return Status::Ok();
    return Status::InvalidArgument(source_.Where(name) + ": tensor `" + name + "` has shape " +
                                   ShapeString(got) + ", the config implies " + ShapeString(want));
  }

  void Progress() {
    ++done_;
    // About ten progress lines per load, whatever the model size.
    if (log_ && (done_ == total_ || done_ * 10 / total_ != (done_ - 1) * 10 / total_)) {
      log_("loaded " + std::to_string(done_) + "/" + std::to_string(total_) + " tensors");
    }
  }

  WeightSource& source_;
  at::ScalarType dtype_;
  at::Device device_;
  int64_t total_;
  int64_t done_ = 0;
  const LogFn& log_;
};

}  // namespace

int64_t LinearWeight::rows() const {
  if (!quantized()) return dense.dim() == 2 ? dense.size(0) : -1;
  int64_t rows = 0;
  for (const kernels::QuantMatrix& p : parts) rows += p.rows;
  return rows;
}

int64_t LinearWeight::cols() const {
  if (!quantized()) return dense.dim() == 2 ? dense.size(1) : -1;
  return parts.empty() ? 0 : parts[0].cols;
}

int64_t LinearWeight::nbytes() const {
  if (!quantized()) return static_cast<int64_t>(dense.nbytes());
  int64_t bytes = 0;
  for (const kernels::QuantMatrix& p : parts) bytes += p.nbytes();
  return bytes;
}

std::string LinearWeight::format() const {
  if (!quantized()) return c10::toString(dense.scalar_type());
  std::string out;
  for (const kernels::QuantMatrix& p : parts) {
    const std::string name = kernels::quant_format(p.type).name;
    if (out.find(name) == std::string::npos) out += (out.empty() ? "" : "+") + name;
  }
  return out;
}

LinearWeight StackRows(std::vector<LinearWeight> parts, at::ScalarType dtype) {
  bool all_dense = true, all_quantized = true;
  for (const LinearWeight& p : parts) {
    all_dense = all_dense && !p.quantized();
    all_quantized = all_quantized && p.quantized();
  }
  LinearWeight out;
  if (all_quantized) {
    // Merge consecutive row groups of one block type.
    std::vector<kernels::QuantMatrix> run;
    auto flush = [&] {
      if (!run.empty()) out.parts.push_back(run.size() == 1 ? run[0] : kernels::concat_rows(run));
      run.clear();
    };
    for (const LinearWeight& p : parts) {
      for (const kernels::QuantMatrix& q : p.parts) {
        if (!run.empty() && run[0].type != q.type) flush();
        run.push_back(q);
      }
    }
    flush();
    return out;
  }
  std::vector<at::Tensor> dense;
  for (const LinearWeight& p : parts) {
    if (!p.quantized()) {
      dense.push_back(p.dense);
      continue;
    }
    for (const kernels::QuantMatrix& q : p.parts) dense.push_back(kernels::dequantize(q).to(dtype));
  }
  out.dense = all_dense ? at::cat(dense, 0) : at::cat(dense, 0).to(dtype);
  return out;
}

StatusOr<LinearWeight> WeightSource::LoadLinear(const std::string& hf_name, at::ScalarType dtype,
                                                at::Device device) {
  auto t = Load(hf_name, dtype, device);
  if (!t.ok()) return t.status();
  LinearWeight w;
  w.dense = std::move(t).value();
  return w;
}

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
                               loader.GetLinear("model.embed_tokens.weight", c.vocab, c.hidden));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LayerWeights l;
      LinearWeight q, k, v, gate, up;
      SNAPSERVE_ASSIGN_OR_RETURN(l.attn_norm, loader.Get(p + "input_layernorm.weight", {c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(q,
                                 loader.GetLinear(p + "self_attn.q_proj.weight", q_rows, c.hidden));
      SNAPSERVE_ASSIGN_OR_RETURN(
          k, loader.GetLinear(p + "self_attn.k_proj.weight", kv_rows, c.hidden));
      SNAPSERVE_ASSIGN_OR_RETURN(
          v, loader.GetLinear(p + "self_attn.v_proj.weight", kv_rows, c.hidden));
      SNAPSERVE_ASSIGN_OR_RETURN(l.o_proj,
                                 loader.GetLinear(p + "self_attn.o_proj.weight", c.hidden, q_rows));
      SNAPSERVE_ASSIGN_OR_RETURN(l.mlp_norm,
                                 loader.Get(p + "post_attention_layernorm.weight", {c.hidden}));
      SNAPSERVE_ASSIGN_OR_RETURN(
          gate, loader.GetLinear(p + "mlp.gate_proj.weight", c.intermediate, c.hidden));
      SNAPSERVE_ASSIGN_OR_RETURN(
          up, loader.GetLinear(p + "mlp.up_proj.weight", c.intermediate, c.hidden));
      SNAPSERVE_ASSIGN_OR_RETURN(
          l.down, loader.GetLinear(p + "mlp.down_proj.weight", c.hidden, c.intermediate));
      l.qkv = StackRows({std::move(q), std::move(k), std::move(v)}, dtype);
      l.gate_up = StackRows({std::move(gate), std::move(up)}, dtype);
      w.layers.push_back(std::move(l));
    }
    SNAPSERVE_ASSIGN_OR_RETURN(w.final_norm, loader.Get("model.norm.weight", {c.hidden}));
    if (c.tie_word_embeddings) {
      w.lm_head = w.embed;
    } else {
      SNAPSERVE_ASSIGN_OR_RETURN(w.lm_head, loader.GetLinear("lm_head.weight", c.vocab, c.hidden));
    }
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("assembling weights failed: ") +
                            e.what_without_backtrace());
  }

  if (log) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[160];
    int64_t matrix_bytes = w.embed.nbytes() + (c.tie_word_embeddings ? 0 : w.lm_head.nbytes());
    for (const LayerWeights& l : w.layers) {
      matrix_bytes += l.qkv.nbytes() + l.o_proj.nbytes() + l.gate_up.nbytes() + l.down.nbytes();
    }
    std::snprintf(line, sizeof(line),
                  "weights loaded in %.2f s: matrices %s, %.1f MiB; resident memory %.1f MiB", secs,
                  w.layers.empty() ? "-" : w.layers[0].down.format().c_str(),
                  static_cast<double>(matrix_bytes) / (1 << 20),
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

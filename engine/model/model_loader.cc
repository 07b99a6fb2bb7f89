// LoadModel (declared in llama_model.h): picks the format from the path, reads
// the config, loads the weights, and converts any c10::Error into a Status.
// A path `synthetic:<preset>...` is no file: random weights of a preset's
// shapes (synthetic_weights.h).
#include <sys/stat.h>

#include <chrono>
#include <cstdio>

#include "engine/model/gguf_file.h"
#include "engine/model/gguf_tensor_plan.h"
#include "engine/model/gguf_weights.h"
#include "engine/model/llama_model.h"
#include "engine/model/synthetic_weights.h"
#include "kernels/cpu/cpu_isa.h"

namespace snapserve::model {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const std::string& path, at::ScalarType dtype,
                                                at::Device device, const LogFn& log,
                                                const LinearPrecision& precision) {
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    return Status::InvalidArgument(path + ": dtype must be float32, bfloat16 or float16");
  }
  const auto start = std::chrono::steady_clock::now();
  ModelConfig config;
  std::unique_ptr<WeightSource> source;
  if (IsSyntheticSpec(path)) {
    auto spec = ParseSyntheticSpec(path);
    if (!spec.ok()) return spec.status();
    config = spec->config;
    source = OpenSyntheticWeights(*spec);
  } else if (IsDirectory(path)) {
    auto c = LoadHfConfig(path);
    if (!c.ok()) return c.status();
    config = std::move(c).value();
    auto s = OpenHfWeights(path);
    if (!s.ok()) return s.status();
    source = std::move(s).value();
  } else if (EndsWith(path, ".gguf")) {
    auto f = GgufFile::Open(path);
    if (!f.ok()) return f.status();
    std::shared_ptr<const GgufFile> file = std::move(f).value();
    auto c = ModelConfigFromGguf(*file);
    if (!c.ok()) return c.status();
    config = std::move(c).value();
    SNAPSERVE_RETURN_IF_ERROR(CheckGgufTensorTable(*file, config));
    source = OpenGgufWeights(file, config);
  } else {
    return Status::InvalidArgument(path +
                                   ": expected a .gguf file, a Hugging Face directory or "
                                   "synthetic:<preset>[?format=<f>][&seed=<n>]");
  }
  if (log) log(path + ": " + config.DebugString());
  auto weights = AssembleWeights(config, *source, dtype, device, log);
  if (!weights.ok()) return weights.status();
  try {
    // Chosen here, at load time, so that a bad SNAPSERVE_CPU_ISA fails the
    // start rather than the first request.
    const char* isa = kernels::cpu_isa_name(kernels::cpu_isa());
    auto model = std::make_unique<LlamaModel>(std::move(config), std::move(weights).value(), dtype,
                                              device, precision);
    if (log) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      char line[128];
      std::snprintf(line, sizeof(line), "model ready in %.2f s (CPU kernels: %s, GGUF blocks: %s)",
                    secs, isa, precision.dot == kernels::QuantDot::kInt8 ? "int8 dot" : "exact");
      log(line);
    }
    return model;
  } catch (const c10::Error& e) {
    return Status::Internal(path + ": building the model failed: " + e.what_without_backtrace());
  }
}

}  // namespace snapserve::model

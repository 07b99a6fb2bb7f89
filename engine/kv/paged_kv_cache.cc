#include "engine/kv/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>

#include "kernels/kv_append.h"
#include "kernels/paged_attention.h"

namespace snapserve::kv {

namespace {

at::Tensor to_device(std::vector<int32_t> host, std::vector<int64_t> sizes, c10::Device device) {
  at::Tensor t = at::from_blob(host.data(), sizes, at::kInt).clone();
  return device.is_cpu() ? t : t.to(device);
}

at::Tensor to_device(std::vector<int64_t> host, c10::Device device) {
  at::Tensor t = at::from_blob(host.data(), {static_cast<int64_t>(host.size())}, at::kLong).clone();
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace

int32_t PagedKvCache::NumBlocksForBudget(const PagedKvCacheConfig& config, int64_t budget_bytes) {
  const int64_t per_block = BlockPool::BytesPerBlock(
      config.num_layers, config.num_kv_heads, config.block_size, config.head_dim,
      static_cast<int64_t>(c10::elementSize(config.dtype)));
  return BlockPool::BlocksForBudget(budget_bytes, per_block);
}

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const PagedKvCacheConfig& config) {
  if (config.num_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0 ||
      config.block_size <= 0) {
    return Status::InvalidArgument(
        "PagedKvCache: layers, KV heads, head_dim and block_size must be positive");
  }
  if (config.num_blocks <= 0) {
    return Status::ResourceExhausted("PagedKvCache: the KV cache budget holds no block");
  }
  if (config.dtype != at::kFloat && config.dtype != at::kBFloat16 && config.dtype != at::kHalf) {
    return Status::InvalidArgument("PagedKvCache: dtype must be float32, bfloat16 or float16");
  }
  try {
    return std::unique_ptr<PagedKvCache>(new PagedKvCache(config));
  } catch (const c10::Error& e) {
    // Out of device memory is the expected failure here.
    return Status::ResourceExhausted(std::string("PagedKvCache: allocation failed: ") +
                                     e.what_without_backtrace());
  }
}

PagedKvCache::PagedKvCache(const PagedKvCacheConfig& config)
    : config_(config), pool_(config.num_blocks) {
  // One allocation for everything: fewer allocator segments, and every
  // per-layer view is contiguous as the kernels require.
  storage_ = at::empty({2, config.num_layers, config.num_blocks, config.num_kv_heads,
                        config.block_size, config.head_dim},
                       at::TensorOptions().dtype(config.dtype).device(config.device));
  for (int64_t l = 0; l < config.num_layers; ++l) {
    key_caches_.push_back(storage_[0][l]);
    value_caches_.push_back(storage_[1][l]);
  }
}

PagedKvCache::Sequence& PagedKvCache::Find(int64_t seq) {
  auto it = seqs_.find(seq);
  TORCH_CHECK(it != seqs_.end(), "PagedKvCache: unknown sequence ", seq);
  return it->second;
}

const PagedKvCache::Sequence& PagedKvCache::Find(int64_t seq) const {
  auto it = seqs_.find(seq);
  TORCH_CHECK(it != seqs_.end(), "PagedKvCache: unknown sequence ", seq);
  return it->second;
}

Status PagedKvCache::AddSequence(int64_t seq, int64_t reserve_tokens, KvSelector selector) {
  if (seqs_.contains(seq)) {
    return Status::InvalidArgument("PagedKvCache: sequence " + std::to_string(seq) +
                                   " already registered");
  }
  if (!CanEverFit(reserve_tokens)) {
    return Status::ResourceExhausted(
        "KV cache: " + std::to_string(reserve_tokens) + " tokens exceed the whole cache (" +
        std::to_string(pool_.num_total() * int64_t{block_size()}) + " tokens)");
  }
  Sequence s(config_.block_size);
  SNAPSERVE_RETURN_IF_ERROR(s.table.EnsureCapacity(reserve_tokens, pool_));
  s.selector = std::move(selector);
  seqs_.emplace(seq, std::move(s));
  return Status::Ok();
}

void PagedKvCache::RemoveSequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // The table only holds ids this pool handed out, so Free cannot fail short
  // of memory corruption; nothing useful to do with the status here.
  (void)it->second.table.Release(pool_);
  seqs_.erase(it);
  step_.reset();
}

void PagedKvCache::SetSelector(int64_t seq, KvSelector selector) {
  Find(seq).selector = std::move(selector);
}

int64_t PagedKvCache::num_tokens(int64_t seq) const { return Find(seq).table.num_tokens(); }

bool PagedKvCache::CanReserve(int64_t tokens) const {
  return BlockTable::BlocksFor(tokens, config_.block_size) <= pool_.num_free();
}

bool PagedKvCache::CanEverFit(int64_t tokens) const {
  return BlockTable::BlocksFor(tokens, config_.block_size) <= pool_.num_total();
}

double PagedKvCache::usage_ratio() const {
  return pool_.num_total() == 0 ? 0.0 : static_cast<double>(pool_.num_used()) / pool_.num_total();
}

void PagedKvCache::StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& v) {
  Sequence& s = Find(seq);
  TORCH_CHECK(layer >= 0 && layer < config_.num_layers, "PagedKvCache: layer ", layer,
              " out of range");
  // Layer 0 (re)starts a prefill; entries are only committed after the last
  // layer, so an abandoned prefill leaves nothing behind but reused slots.
  if (layer == 0) s.prefill_next_layer = 0;
  TORCH_CHECK(layer == s.prefill_next_layer, "PagedKvCache: prefill of sequence ", seq,
              " expected layer ", s.prefill_next_layer, ", got ", layer);

  at::Tensor kept_k = k;
  at::Tensor kept_v = v;
  if (s.selector) std::tie(kept_k, kept_v) = s.selector(layer, q, k, v);
  TORCH_CHECK(kept_k.dim() == 3 && kept_k.size(0) == config_.num_kv_heads &&
                  kept_k.size(2) == config_.head_dim && kept_v.sizes() == kept_k.sizes(),
              "PagedKvCache: kept k/v must be [", config_.num_kv_heads, ", m, ", config_.head_dim,
              "], got ", kept_k.sizes(), " and ", kept_v.sizes());
  const int64_t m = kept_k.size(1);

  if (layer == 0) {
    const int64_t base = s.table.num_tokens();
    const Status st = s.table.EnsureCapacity(base + m, pool_);
    TORCH_CHECK(st.ok(), "PagedKvCache: sequence ", seq, ": ", st.message());
    std::vector<int64_t> slots(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) slots[static_cast<size_t>(i)] = s.table.slot_index(base + i);
    s.prefill_slots = to_device(std::move(slots), config_.device);
    s.prefill_len = m;
  }
  TORCH_CHECK(m == s.prefill_len, "PagedKvCache: layer ", layer, " kept ", m,
              " entries, layer 0 kept ", s.prefill_len, " (every layer must keep the same count)");

  // [G, m, d] -> [m, G, d] as kv_append takes tokens first.
  const auto opts = at::TensorOptions().dtype(config_.dtype).device(config_.device);
  kernels::kv_append(key_caches_[layer], value_caches_[layer], kept_k.to(opts).transpose(0, 1),
                     kept_v.to(opts).transpose(0, 1), s.prefill_slots);

  s.prefill_next_layer = layer + 1;
  if (s.prefill_next_layer == config_.num_layers) {
    s.table.set_num_tokens(s.table.num_tokens() + s.prefill_len);
    s.prefill_next_layer = 0;
    s.prefill_len = 0;
    s.prefill_slots = at::Tensor();
  }
}

void PagedKvCache::BeginDecodeStep(const std::vector<int64_t>& seqs) {
  const int64_t batch = static_cast<int64_t>(seqs.size());
  int64_t max_blocks = 1;
  std::vector<Sequence*> rows;
  rows.reserve(seqs.size());
  for (int64_t id : seqs) {
    Sequence& s = Find(id);
    // Normally inside the admission reservation; growth past it can fail.
    const Status st = s.table.EnsureCapacity(s.table.num_tokens() + 1, pool_);
    TORCH_CHECK(st.ok(), "PagedKvCache: sequence ", id, ": ", st.message());
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s.table.block_ids().size()));
    rows.push_back(&s);
  }
  std::vector<int32_t> tables(static_cast<size_t>(batch * max_blocks), 0);
  std::vector<int32_t> lens(static_cast<size_t>(batch));
  std::vector<int64_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const BlockTable& t = rows[static_cast<size_t>(b)]->table;
    std::copy(t.block_ids().begin(), t.block_ids().end(),
              tables.begin() + static_cast<std::ptrdiff_t>(b * max_blocks));
    lens[static_cast<size_t>(b)] = static_cast<int32_t>(t.num_tokens() + 1);
    slots[static_cast<size_t>(b)] = t.slot_index(t.num_tokens());
  }
  DecodeStep step;
  step.seqs = seqs;
  step.block_tables = to_device(std::move(tables), {batch, max_blocks}, config_.device);
  step.context_lens = to_device(std::move(lens), {batch}, config_.device);
  step.slots = to_device(std::move(slots), config_.device);
  step_ = std::move(step);
}

at::Tensor PagedKvCache::DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer,
                                         const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v) {
  TORCH_CHECK(layer >= 0 && layer < config_.num_layers, "PagedKvCache: layer ", layer,
              " out of range");
  TORCH_CHECK(q.dim() == 3 && q.size(0) == static_cast<int64_t>(seqs.size()),
              "PagedKvCache: q must be [", seqs.size(), ", H, d], got ", q.sizes());
  TORCH_CHECK(step_ && step_->seqs == seqs && step_->next_layer == layer,
              "PagedKvCache: decode layer ", layer,
              " does not continue a step begun (BeginDecodeStep) with the same sequences");
  const auto opts = at::TensorOptions().dtype(config_.dtype).device(config_.device);
  kernels::kv_append(key_caches_[layer], value_caches_[layer], k.to(opts), v.to(opts),
                     step_->slots);
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.head_dim));
  // A float32 query on CPU reads a low-precision cache directly (no rounding
  // of q to the cache dtype; see kernels/paged_attention.h).
  const bool keep_q = q.is_cpu() && q.scalar_type() == at::kFloat;
  at::Tensor out = kernels::paged_decode_attention(keep_q ? q : q.to(opts), key_caches_[layer],
                                                   value_caches_[layer], step_->block_tables,
                                                   step_->context_lens, scale);

  step_->next_layer = layer + 1;
  return out.to(q.scalar_type());
}

void PagedKvCache::EndDecodeStep() {
  TORCH_CHECK(step_ && step_->next_layer == config_.num_layers,
              "PagedKvCache: EndDecodeStep before every layer of the step ran");
  for (int64_t id : step_->seqs) {
    BlockTable& t = Find(id).table;
    t.set_num_tokens(t.num_tokens() + 1);
  }
  step_.reset();
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::Gather(int64_t seq, int64_t layer) const {
  const BlockTable& t = Find(seq).table;
  const int64_t n = t.num_tokens();
  const int64_t used = BlockTable::BlocksFor(n, config_.block_size);
  std::vector<int64_t> ids(t.block_ids().begin(), t.block_ids().begin() + used);
  const at::Tensor index = to_device(std::move(ids), config_.device);
  auto dense = [&](const at::Tensor& cache) {
    // [blocks, G, bs, d] -> [G, blocks * bs, d], then the first n entries.
    return cache.index_select(0, index)
        .permute({1, 0, 2, 3})
        .reshape({config_.num_kv_heads, used * config_.block_size, config_.head_dim})
        .narrow(1, 0, n);
  };
  return {dense(key_caches_.at(layer)), dense(value_caches_.at(layer))};
}

}  // namespace snapserve::kv

#include "engine/kv/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/huge_pages.h"
#include "kernels/fused/fused_cuda.h"
#include "kernels/kv_append/kv_append.h"
#include "kernels/paged_attention/paged_attention.h"

namespace snapserve::kv {

namespace {

at::Tensor to_device(std::vector<int32_t> host, const std::vector<int64_t>& sizes,
                     c10::Device device) {
  at::Tensor t = at::from_blob(host.data(), sizes, at::kInt).clone();
  return device.is_cpu() ? t : t.to(device);
}

at::Tensor to_device(std::vector<int64_t> host, const std::vector<int64_t>& sizes,
                     c10::Device device) {
  at::Tensor t = at::from_blob(host.data(), sizes, at::kLong).clone();
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace

int64_t PagedKvCache::BytesPerBlock(const PagedKvCacheConfig& config) {
  const int64_t values = BlockPool::BytesPerBlock(
      /*num_layers=*/1, /*num_kv_heads=*/1, config.block_size, config.head_dim,
      static_cast<int64_t>(c10::elementSize(config.dtype)));
  if (config.dtype != at::kChar) return values;
  // int8: a float32 scale per 16 values beside them (kernels/kv_append/kv_append.h).
  return values + BlockPool::BytesPerBlock(1, 1, config.block_size,
                                           config.head_dim / kernels::kKvInt8Group,
                                           static_cast<int64_t>(sizeof(float)));
}

int32_t PagedKvCache::NumBlocksForBudget(const PagedKvCacheConfig& config, int64_t budget_bytes) {
  return BlockPool::BlocksForBudget(budget_bytes, BytesPerBlock(config));
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
  if (config.sliding_window < 0) {
    return Status::InvalidArgument("PagedKvCache: sliding_window must not be negative");
  }
  if (config.dtype != at::kFloat && config.dtype != at::kBFloat16 && config.dtype != at::kHalf &&
      config.dtype != at::kChar) {
    return Status::InvalidArgument(
        "PagedKvCache: dtype must be float32, bfloat16, float16 or int8");
  }
  if (config.dtype == at::kChar && !config.device.is_cpu()) {
    return Status::InvalidArgument("KV cache dtype int8: CPU only (no CUDA kernels read it)");
  }
  if (config.dtype == at::kChar && config.head_dim % kernels::kKvInt8Group != 0) {
    return Status::InvalidArgument("KV cache dtype int8: head_dim " +
                                   std::to_string(config.head_dim) + " is not a multiple of " +
                                   std::to_string(kernels::kKvInt8Group));
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
  // One allocation for everything: fewer allocator segments, and both views
  // are contiguous as the kernels require.
  storage_ = at::empty({2, config.num_blocks, 1, config.block_size, config.head_dim},
                       at::TensorOptions().dtype(config.dtype).device(config.device));
  // Before anything writes it: a decode step reads scattered blocks, and
  // 2 MiB pages spare it a TLB miss per block (kernels/cpu/huge_pages.h).
  huge_pages_ = kernels::AdviseHugePages(storage_);
  if (config.prefault) storage_.zero_();
  key_cache_ = storage_[0];
  value_cache_ = storage_[1];
  if (config.dtype == at::kChar) {
    scale_storage_ = at::empty(
        {2, config.num_blocks, 1, config.block_size, config.head_dim / kernels::kKvInt8Group},
        at::TensorOptions().dtype(at::kFloat).device(config.device));
    kernels::AdviseHugePages(scale_storage_);
    if (config.prefault) scale_storage_.zero_();
    key_scales_ = scale_storage_[0];
    value_scales_ = scale_storage_[1];
  }
}

void PagedKvCache::Append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots) {
  if (config_.dtype == at::kChar) {
    // Callers hand float32 rows (row_dtype()); the kernel checks it.
    kernels::kv_append_int8(key_cache_, key_scales_, value_cache_, value_scales_, k, v, slots);
  } else {
    kernels::kv_append(key_cache_, value_cache_, k, v, slots);
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

BlockTable& PagedKvCache::Lane(Sequence& s, int64_t layer, int64_t kv_head) {
  return s.lanes[static_cast<size_t>(layer * config_.num_kv_heads + kv_head)];
}

Status PagedKvCache::Grow(Sequence& s, BlockTable& lane, int64_t tokens) {
  const int64_t missing = BlockTable::BlocksFor(tokens, config_.block_size) -
                          static_cast<int64_t>(lane.block_ids().size());
  if (missing <= 0) return Status::Ok();
  const int64_t from_spare = std::min<int64_t>(missing, static_cast<int64_t>(s.spare.size()));
  std::vector<int32_t> blocks(s.spare.end() - from_spare, s.spare.end());
  if (missing > from_spare) {
    // Past the reservation (the admission bound was not enough): the pool
    // may still have room; all or nothing, so nothing is lost on failure.
    SNAPSERVE_ASSIGN_OR_RETURN(const std::vector<int32_t> extra,
                               pool_.Allocate(missing - from_spare));
    blocks.insert(blocks.end(), extra.begin(), extra.end());
  }
  s.spare.resize(s.spare.size() - static_cast<size_t>(from_spare));
  lane.AddBlocks(blocks);
  return Status::Ok();
}

int64_t PagedKvCache::Held(int64_t written) const {
  return config_.sliding_window > 0 ? std::min(written, config_.sliding_window) : written;
}

int64_t PagedKvCache::RingIndex(int64_t entry) const {
  return config_.sliding_window > 0 ? entry % config_.sliding_window : entry;
}

void PagedKvCache::Commit(Sequence& s, size_t i, int64_t added) {
  s.written[i] += added;
  s.lanes[i].set_num_tokens(Held(s.written[i]));
}

int64_t PagedKvCache::BlocksFor(const LaneReservation& reservation) const {
  const int64_t bs = config_.block_size;
  const int64_t heads = config_.num_kv_heads;
  int64_t blocks = 0;
  for (int64_t wanted : reservation.entries_per_layer) {
    const int64_t entries = Held(wanted);
    if (entries <= 0) continue;
    // Any split of heads * entries over `heads` lanes needs at most
    // sum(ceil(e_g / bs)) <= (heads * entries + heads * (bs - 1)) / bs blocks.
    blocks += reservation.heads_share ? (heads * (entries + bs - 1)) / bs
                                      : heads * BlockTable::BlocksFor(entries, config_.block_size);
  }
  return blocks;
}

int64_t PagedKvCache::BlocksForUniform(int64_t tokens) const {
  return BlocksFor(LaneReservation{
      std::vector<int64_t>(static_cast<size_t>(config_.num_layers), tokens), false});
}

Status PagedKvCache::AddSequence(int64_t seq, int64_t reserve_blocks, KvSelector selector) {
  if (seqs_.contains(seq)) {
    return Status::InvalidArgument("PagedKvCache: sequence " + std::to_string(seq) +
                                   " already registered");
  }
  if (!CanEverFit(reserve_blocks)) {
    return Status::ResourceExhausted("KV cache: " + std::to_string(reserve_blocks) +
                                     " blocks exceed the whole cache (" +
                                     std::to_string(pool_.num_total()) + " blocks)");
  }
  SNAPSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> reserved,
                             pool_.Allocate(std::max<int64_t>(reserve_blocks, 0)));
  Sequence s;
  s.lanes.assign(static_cast<size_t>(config_.num_layers * config_.num_kv_heads),
                 BlockTable(config_.block_size));
  s.written.assign(s.lanes.size(), 0);
  s.spare = std::move(reserved);
  s.selector = std::move(selector);
  seqs_.emplace(seq, std::move(s));
  return Status::Ok();
}

void PagedKvCache::RemoveSequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // The tables only hold ids this pool handed out, so Free cannot fail short
  // of memory corruption; nothing useful to do with the status here.
  for (BlockTable& lane : it->second.lanes) (void)lane.Release(pool_);
  (void)pool_.Free(it->second.spare);
  seqs_.erase(it);
  step_.reset();
}

void PagedKvCache::SetSelector(int64_t seq, KvSelector selector) {
  Find(seq).selector = std::move(selector);
}

int64_t PagedKvCache::num_tokens(int64_t seq, int64_t layer, int64_t kv_head) const {
  TORCH_CHECK(
      layer >= 0 && layer < config_.num_layers && kv_head >= 0 && kv_head < config_.num_kv_heads,
      "PagedKvCache: no lane (", layer, ", ", kv_head, ")");
  return Find(seq).lanes[static_cast<size_t>(layer * config_.num_kv_heads + kv_head)].num_tokens();
}

int64_t PagedKvCache::total_entries(int64_t seq) const {
  int64_t total = 0;
  for (const BlockTable& lane : Find(seq).lanes) total += lane.num_tokens();
  return total;
}

int64_t PagedKvCache::bytes_held(int64_t seq) const {
  int64_t blocks = 0;
  for (const BlockTable& lane : Find(seq).lanes)
    blocks += static_cast<int64_t>(lane.block_ids().size());
  return blocks * BytesPerBlock(config_);
}

double PagedKvCache::usage_ratio() const {
  return pool_.num_total() == 0 ? 0.0 : static_cast<double>(pool_.num_used()) / pool_.num_total();
}

void PagedKvCache::StorePrefillLayer(int64_t seq, int64_t layer, const at::Tensor& q,
                                     const at::Tensor& k, const at::Tensor& v) {
  Sequence& s = Find(seq);
  TORCH_CHECK(layer >= 0 && layer < config_.num_layers, "PagedKvCache: layer ", layer,
              " out of range");
  const int64_t heads = config_.num_kv_heads;
  // Layer 0 (re)starts a prefill; entries are only committed after the last
  // layer, so an abandoned prefill leaves nothing behind but reused slots.
  if (layer == 0) {
    s.prefill_next_layer = 0;
    s.prefill_lengths.assign(s.lanes.size(), 0);
  }
  TORCH_CHECK(layer == s.prefill_next_layer, "PagedKvCache: prefill of sequence ", seq,
              " expected layer ", s.prefill_next_layer, ", got ", layer);

  KeptKv kept{k, v, {}};
  if (s.selector) kept = s.selector(layer, q, k, v);
  TORCH_CHECK(kept.k.dim() == 3 && kept.k.size(0) == heads && kept.k.size(2) == config_.head_dim &&
                  kept.v.sizes() == kept.k.sizes(),
              "PagedKvCache: kept k/v must be [", heads, ", m, ", config_.head_dim, "], got ",
              kept.k.sizes(), " and ", kept.v.sizes());
  const int64_t m = kept.k.size(1);
  std::vector<int64_t> lengths = kept.head_lengths;
  if (lengths.empty()) lengths.assign(static_cast<size_t>(heads), m);
  TORCH_CHECK(static_cast<int64_t>(lengths.size()) == heads, "PagedKvCache: ", lengths.size(),
              " head lengths for ", heads, " KV heads");

  // Slots of every kept entry, lane after lane, after what each lane holds.
  // With a sliding window only the last W of a lane's entries are written:
  // the earlier ones would share their ring slots, and no query sees them.
  std::vector<int64_t> slots;
  std::vector<int64_t> rows;  // flat row g * m + i of kept.k for each slot
  for (int64_t g = 0; g < heads; ++g) {
    const int64_t len = lengths[static_cast<size_t>(g)];
    TORCH_CHECK(len >= 0 && len <= m, "PagedKvCache: head ", g, " keeps ", len, " of ", m, " rows");
    BlockTable& lane = Lane(s, layer, g);
    const int64_t base = s.written[static_cast<size_t>(layer * heads + g)];
    const Status st = Grow(s, lane, Held(base + len));
    TORCH_CHECK(st.ok(), "PagedKvCache: sequence ", seq, ": ", st.message());
    const int64_t first =
        config_.sliding_window > 0 ? std::max<int64_t>(0, len - config_.sliding_window) : 0;
    for (int64_t i = first; i < len; ++i) {
      slots.push_back(lane.slot_index(RingIndex(base + i)));
      rows.push_back(g * m + i);
    }
    s.prefill_lengths[static_cast<size_t>(layer * heads + g)] = len;
  }
  // Rows in the dtype Append takes (float32 for int8, which it quantizes).
  const auto opts = at::TensorOptions().dtype(row_dtype()).device(config_.device);
  const bool every_row = static_cast<int64_t>(rows.size()) == heads * m;
  if (every_row && config_.device.is_cpu() && kept.k.scalar_type() == row_dtype() &&
      kept.v.scalar_type() == row_dtype()) {
    // Each KV head's rows as they lie (views of the prompt's qkv product):
    // the CPU append takes strided rows, so no [G * m] copy first.
    for (int64_t g = 0; g < heads && m > 0; ++g) {
      const std::vector<int64_t> head_slots(slots.begin() + g * m, slots.begin() + (g + 1) * m);
      Append(kept.k[g].unsqueeze(1), kept.v[g].unsqueeze(1),
             to_device(head_slots, {m}, config_.device));
    }
  } else {
    // [G, m, d] -> [G * m, 1, d]: each lane is one KV head of the lane cache.
    at::Tensor flat_k = kept.k.to(opts).reshape({heads * m, 1, config_.head_dim});
    at::Tensor flat_v = kept.v.to(opts).reshape({heads * m, 1, config_.head_dim});
    if (!every_row) {
      const at::Tensor index = to_device(rows, {static_cast<int64_t>(rows.size())}, config_.device);
      flat_k = flat_k.index_select(0, index);
      flat_v = flat_v.index_select(0, index);
    }
    const int64_t count = static_cast<int64_t>(slots.size());
    if (count > 0) {
      Append(flat_k, flat_v, to_device(std::move(slots), {count}, config_.device));
    }
  }

  s.prefill_next_layer = layer + 1;
  if (s.prefill_next_layer == config_.num_layers) {
    for (size_t i = 0; i < s.lanes.size(); ++i) Commit(s, i, s.prefill_lengths[i]);
    s.prefill_next_layer = 0;
    s.prefill_lengths.clear();
  }
}

void PagedKvCache::BeginDecodeStep(const std::vector<int64_t>& seqs) {
  const int64_t batch = static_cast<int64_t>(seqs.size());
  const int64_t layers = config_.num_layers;
  const int64_t heads = config_.num_kv_heads;
  int64_t max_blocks = 1;
  std::vector<Sequence*> rows;
  rows.reserve(seqs.size());
  for (int64_t id : seqs) {
    Sequence& s = Find(id);
    for (size_t i = 0; i < s.lanes.size(); ++i) {
      BlockTable& lane = s.lanes[i];
      // Normally inside the admission reservation; growth past it can fail.
      const Status st = Grow(s, lane, Held(s.written[i] + 1));
      TORCH_CHECK(st.ok(), "PagedKvCache: sequence ", id, ": ", st.message());
      max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(lane.block_ids().size()));
    }
    rows.push_back(&s);
  }
  const int64_t lanes_per_layer = batch * heads;
  std::vector<int32_t> tables(static_cast<size_t>(layers * lanes_per_layer * max_blocks), 0);
  std::vector<int32_t> lens(static_cast<size_t>(layers * lanes_per_layer));
  std::vector<int64_t> slots(static_cast<size_t>(layers * lanes_per_layer));
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t g = 0; g < heads; ++g) {
        Sequence& s = *rows[static_cast<size_t>(b)];
        const BlockTable& t = Lane(s, l, g);
        const int64_t written = s.written[static_cast<size_t>(l * heads + g)];
        const int64_t row = l * lanes_per_layer + b * heads + g;
        std::copy(t.block_ids().begin(), t.block_ids().end(),
                  tables.begin() + static_cast<std::ptrdiff_t>(row * max_blocks));
        // The new entry included; with a sliding window it takes the ring
        // slot of the entry that just left the window.
        lens[static_cast<size_t>(row)] = static_cast<int32_t>(Held(written + 1));
        slots[static_cast<size_t>(row)] = t.slot_index(RingIndex(written));
      }
    }
  }
  DecodeStep step;
  step.seqs = seqs;
  step.block_tables =
      to_device(std::move(tables), {layers, lanes_per_layer, max_blocks}, config_.device);
  step.context_lens = to_device(std::move(lens), {layers, lanes_per_layer}, config_.device);
  step.slots = to_device(std::move(slots), {layers, lanes_per_layer}, config_.device);
  step_ = std::move(step);
}

at::Tensor PagedKvCache::DecodeAttention(const std::vector<int64_t>& seqs, int64_t layer,
                                         const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v) {
  TORCH_CHECK(layer >= 0 && layer < config_.num_layers, "PagedKvCache: layer ", layer,
              " out of range");
  const int64_t batch = static_cast<int64_t>(seqs.size());
  const int64_t heads = config_.num_kv_heads;
  TORCH_CHECK(q.dim() == 3 && q.size(0) == batch && q.size(1) % heads == 0,
              "PagedKvCache: q must be [", batch, ", H, d] with H a multiple of ", heads, ", got ",
              q.sizes());
  TORCH_CHECK(step_ && step_->seqs == seqs && step_->next_layer == layer,
              "PagedKvCache: decode layer ", layer,
              " does not continue a step begun (BeginDecodeStep) with the same sequences");
  const auto opts = at::TensorOptions().dtype(row_dtype()).device(config_.device);
  const int64_t d = config_.head_dim;
  // Lane rows: [B, G, d] -> [B * G, 1, d]; the G query heads of a GQA group
  // (h = g * group + j) become the query heads of lane row b * G + g.
  // A float32 query on CPU reads a low-precision cache directly (no rounding
  // of q to the cache dtype; see kernels/paged_attention/paged_attention.h), and float32 K/V
  // rows are rounded into it by the append itself (kernels/kv_append/kv_append.h).
  const bool keep_q = q.is_cpu() && q.scalar_type() == at::kFloat;
  auto rows = [&](const at::Tensor& t) {
    const bool in_place = t.is_cpu() && t.scalar_type() == at::kFloat;
    return (in_place ? t : t.to(opts)).reshape({batch * heads, 1, d});
  };
  // CUDA (kernels/fused/fused_cuda.h): the rows are copied from where the qkv
  // product left them, with no contiguous copy first, and a long context is
  // read by many thread blocks at once (split_decode_attention_cuda).
  const bool fused = q.is_cuda() && kernels::cuda_fused_enabled();
  if (fused && k.scalar_type() == config_.dtype && v.scalar_type() == config_.dtype &&
      k.dim() == 3 && k.strides() == v.strides() && k.stride(2) == 1) {
    kernels::kv_append_lanes_cuda(key_cache_, value_cache_, k, v,
                                  step_->slots[layer].view({batch, heads}));
  } else {
    Append(rows(k), rows(v), step_->slots[layer]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor lane_q = (keep_q ? q : q.to(opts)).reshape({batch * heads, -1, d});
  at::Tensor out;
  if (fused && kernels::split_decode_attention_supported(lane_q, key_cache_, value_cache_)) {
    out = at::empty(lane_q.sizes(), lane_q.options());
    kernels::split_decode_attention_cuda(out, lane_q, key_cache_, value_cache_,
                                         step_->block_tables[layer], step_->context_lens[layer],
                                         scale);
  } else {
    out = kernels::paged_decode_attention(lane_q, key_cache_, value_cache_,
                                          step_->block_tables[layer], step_->context_lens[layer],
                                          scale, key_scales_, value_scales_);
  }

  step_->next_layer = layer + 1;
  return out.reshape({batch, -1, d}).to(q.scalar_type());
}

void PagedKvCache::EndDecodeStep() {
  TORCH_CHECK(step_ && step_->next_layer == config_.num_layers,
              "PagedKvCache: EndDecodeStep before every layer of the step ran");
  for (int64_t id : step_->seqs) {
    Sequence& s = Find(id);
    for (size_t i = 0; i < s.lanes.size(); ++i) Commit(s, i, 1);
  }
  step_.reset();
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::GatherLane(int64_t seq, int64_t layer,
                                                           int64_t kv_head) const {
  const int64_t n = num_tokens(seq, layer, kv_head);
  const BlockTable& t =
      Find(seq).lanes[static_cast<size_t>(layer * config_.num_kv_heads + kv_head)];
  const int64_t used = BlockTable::BlocksFor(n, config_.block_size);
  std::vector<int64_t> ids(t.block_ids().begin(), t.block_ids().begin() + used);
  const at::Tensor index = to_device(std::move(ids), {used}, config_.device);
  auto dense = [&](const at::Tensor& cache, int64_t width) {
    // [blocks, 1, bs, width] -> [blocks * bs, width], then the first n entries.
    return cache.index_select(0, index).reshape({used * config_.block_size, width}).narrow(0, 0, n);
  };
  const int64_t d = config_.head_dim;
  if (config_.dtype != at::kChar) return {dense(key_cache_, d), dense(value_cache_, d)};
  // int8: the values as they read back, float(q) · scale (kernels/kv_append/kv_append.h).
  const int64_t groups = d / kernels::kKvInt8Group;
  auto widened = [&](const at::Tensor& cache, const at::Tensor& scales) {
    return (dense(cache, d).to(at::kFloat).view({n, groups, kernels::kKvInt8Group}) *
            dense(scales, groups).unsqueeze(-1))
        .reshape({n, d});
  };
  return {widened(key_cache_, key_scales_), widened(value_cache_, value_scales_)};
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::Gather(int64_t seq, int64_t layer) const {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  for (int64_t g = 0; g < config_.num_kv_heads; ++g) {
    auto [k, v] = GatherLane(seq, layer, g);
    TORCH_CHECK(keys.empty() || k.size(0) == keys.front().size(0),
                "PagedKvCache: the KV heads of layer ", layer,
                " hold different counts; use GatherLane");
    keys.push_back(std::move(k));
    values.push_back(std::move(v));
  }
  return {at::stack(keys), at::stack(values)};
}

}  // namespace snapserve::kv

#include "batch_engine.h"
#include "torch_fmt.h"  // first: see there

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log_forward.h"
#include "cuda_memory.h"
#include "generation.h"
#include "sampling.h"

namespace cuda_agent::lm {
namespace {

// The content key of a full block: its tokens, chained onto the key of the block before it.
uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t n) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ULL;
  for (int64_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(tokens[i]) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
  }
  return h;
}

// Blocks of the pool: held ones (counted references), free ones, and idle cached ones (no
// reference, content kept for reuse, reclaimed least recently used first).
class Blocks {
 public:
  explicit Blocks(int64_t count) : refs_(count, 0), cached_(count), idle_at_(count) {
    for (int64_t b = count - 1; b >= 0; --b) free_.push_back(b);
  }

  int64_t count() const { return static_cast<int64_t>(refs_.size()); }
  int64_t available() const { return static_cast<int64_t>(free_.size() + idle_.size()); }
  int64_t held() const { return count() - available(); }
  int64_t refs(int64_t b) const { return refs_[b]; }

  // A block for new content (its old content forgotten), or -1 when every block is held.
  int64_t take() {
    int64_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else if (!idle_.empty()) {
      b = idle_.front();
      idle_.pop_front();
      forget(b);
    } else {
      return -1;
    }
    refs_[b] = 1;
    return b;
  }

  void hold(int64_t b) {
    if (refs_[b]++ == 0) idle_.erase(idle_at_[b]);
  }

  void release(int64_t b) {
    CA_ASSERT(refs_[b] > 0, "block {} released more often than held", b);
    if (--refs_[b] > 0) return;
    if (cached_[b].valid) {
      idle_at_[b] = idle_.insert(idle_.end(), b);
    } else {
      free_.push_back(b);
    }
  }

  // The cached block holding `tokens` after the block keyed `parent`, or -1.
  int64_t find(uint64_t parent, const int64_t* tokens, int64_t n, uint64_t* key) const {
    *key = block_hash(parent, tokens, n);
    const auto it = by_key_.find(*key);
    if (it == by_key_.end()) return -1;
    const Content& c = cached_[it->second];
    if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), tokens, tokens + n)) return -1;
    return it->second;
  }

  // Block b (held, full or about to be filled) holds `tokens` after the block keyed `parent`.
  // False when that content was known already (another copy is enough).
  bool remember(int64_t b, uint64_t parent, uint64_t key, const int64_t* tokens, int64_t n) {
    if (cached_[b].valid || by_key_.count(key)) return false;
    cached_[b] = {true, key, parent, std::vector<int64_t>(tokens, tokens + n)};
    by_key_[key] = b;
    return true;
  }

 private:
  struct Content {
    bool valid = false;
    uint64_t key = 0, parent = 0;
    std::vector<int64_t> tokens;
  };
  void forget(int64_t b) {
    if (!cached_[b].valid) return;
    by_key_.erase(cached_[b].key);
    cached_[b] = Content{};
  }

  std::vector<int64_t> refs_;
  std::vector<Content> cached_;
  std::vector<std::list<int64_t>::iterator> idle_at_;
  std::vector<int64_t> free_;
  std::list<int64_t> idle_;
  std::unordered_map<uint64_t, int64_t> by_key_;
};

// One sequence: its tokens (prompt, then what was sampled; the last one is still to be fed, so
// its keys are not in the pool yet) and the blocks that hold positions [0, cached).
struct Row {
  size_t index = 0;  // the prompt's index in its call
  std::vector<int64_t> tokens;
  std::vector<int64_t> blocks;
  std::vector<uint64_t> keys;  // content keys of the full blocks, in order
  int64_t cached = 0;
  bool live = true;
  std::vector<int64_t> promised;  // blocks this row's prefill fills that others may already hold
};

struct Call {
  Call(const lm::SamplingOptions& o, std::function<bool(size_t, int64_t)> f)
      : options(o), sampler(o), on_token(std::move(f)) {}
  lm::SamplingOptions options;
  Sampler sampler;
  std::function<bool(size_t, int64_t)> on_token;
  std::vector<Row> rows;
  std::vector<lm::Generation> results;
  std::promise<void> done;
  int64_t admitted = 0;  // admission order: preemption takes the most recent

  int64_t live_rows() const {
    return std::count_if(rows.begin(), rows.end(), [](const Row& r) { return r.live; });
  }
};

using CallPtr = std::shared_ptr<Call>;

// Sampling options that decide a pass of the sampler: rows whose calls agree on them are picked
// together (greedy, temperature, top_k, top_p; the other fields zero when greedy).
using SampleKey = std::tuple<bool, double, int64_t, double>;

SampleKey sample_key(const lm::SamplingOptions& o) {
  const bool greedy = o.greedy || o.temperature == 0.0;
  return greedy ? SampleKey{true, 0.0, 0, 1.0} : SampleKey{false, o.temperature, o.top_k, o.top_p};
}

lm::SamplingOptions sampling_of(const SampleKey& key) {
  lm::SamplingOptions o;
  std::tie(o.greedy, o.temperature, o.top_k, o.top_p) = key;
  return o;
}

// Decode steps pad the keys they attend over to a multiple of this many positions and their rows
// to a bucket (row_bucket), so that a step's shapes change rarely: on a GPU each shape's step is
// captured once as a CUDA graph and replayed.
constexpr int64_t kKeyBucket = 256;
// A decode step's per-row fields in its input buffer, before the block table (step()).
constexpr int64_t kStepFields = 5;
// Most prompt tokens (padding included) in one batched prefill forward, and most attention-mask
// entries (rows x new tokens x keys) in one.
constexpr int64_t kPrefillTokens = 16384;
constexpr int64_t kPrefillMask = int64_t{1} << 25;

int64_t row_bucket(int64_t rows) {
  if (rows > 8) return (rows + 15) / 16 * 16;
  int64_t b = 1;
  while (b < rows) b *= 2;
  return b;
}

}  // namespace

struct BatchEngine::Impl {
  Impl(CausalLMImpl& m, EngineOptions o) : model(m), options(o) {}

  CausalLMImpl& model;
  EngineOptions options;

  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<CallPtr> submitted;  // guarded by mutex
  bool stopping = false;          // guarded by mutex
  lm::EngineStats counters;       // guarded by mutex

  // The worker's own state.
  std::deque<CallPtr> waiting;
  std::vector<CallPtr> running;
  std::unique_ptr<Blocks> blocks;
  PagedKv pool;
  // The pool's last block, outside `blocks`: padding rows and padded positions write there, and
  // padded block-table entries point there (masked out).
  int64_t scratch = 0;
  std::unordered_set<int64_t> pending;  // promised blocks (take_blocks) not written yet
  int64_t admissions = 0;
  std::thread worker;

  // CUDA graphs of decode steps by (rows, table width, the sampling pass when the graph samples
  // too). Every graph of one row count and pass writes its output (the logits, or the picks) to
  // one tensor. They read the pool and the weights where they were at capture: they go with the
  // pool, and when the weights move.
  using GraphShape = std::tuple<int64_t, int64_t, std::optional<SampleKey>>;
  struct Graph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    torch::Tensor input;
  };
  bool use_graphs = false;
  bool paged_kernel = false;  // decode steps attend through paged_attention.h's kernel
  std::map<GraphShape, Graph> graphs;
  std::map<std::pair<int64_t, std::optional<SampleKey>>, torch::Tensor> graph_out;
  std::vector<const void*> graph_weights;
  std::optional<at::cuda::MempoolId_t> graph_pool;

  int64_t blocks_for(int64_t positions) const { return (positions + options.block_size - 1) / options.block_size; }
  int64_t slot(const Row& r, int64_t position) const {
    return r.blocks[position / options.block_size] * options.block_size + position % options.block_size;
  }
  torch::Tensor on_device(const std::vector<int64_t>& v) const {
    return torch::tensor(v, torch::kInt64).to(model.device());
  }
  void count_stats(const std::function<void(lm::EngineStats&)>& f) {
    std::lock_guard<std::mutex> lock(mutex);
    f(counters);
  }
  void drop_pool() {
    graphs.clear();
    graph_out.clear();
    graph_pool.reset();
    blocks.reset();
    pool = PagedKv{};
    pending.clear();
  }

  void loop();
  void admit();
  int64_t blocks_needed(const Call& call, bool count_held) const;
  void take_blocks(Row& row);
  void prefill(const std::vector<Row*>& rows);
  void prefill_forward(const std::vector<Row*>& rows, int64_t len, int64_t keys);
  void remember_full_blocks(Row& row, int64_t upto, bool promise);
  bool make_room(Call& call, Row& row);
  void preempt(const CallPtr& call);
  void step();
  torch::Tensor decode(int64_t rows, int64_t width, const std::vector<int64_t>& input,
                       const std::optional<SampleKey>& sample);
  torch::Tensor decode_forward(int64_t rows, int64_t width, const torch::Tensor& input,
                               const std::optional<SampleKey>& sample);
  void follow_other_threads();
  void finish(const CallPtr& call, std::exception_ptr error);
  void free_rows(Call& call);
};

void BatchEngine::Impl::loop() {
  c10::InferenceMode inference;
  c10::DeviceGuard device(model.device());
  // On a GPU the engine works on a stream of its own (graph capture needs one that is not the
  // default stream).
  std::optional<c10::cuda::CUDAStreamGuard> stream;
  if (model.device().is_cuda()) {
    stream.emplace(c10::cuda::getStreamFromPool(false, model.device().index()));
    use_graphs = options.cuda_graphs;
  }
  paged_kernel = options.paged_attention && model.can_decode_paged();
  // The gate (EngineOptions::gate), outside the mutex: it may block while callers submit.
  bool working = false;
  const auto gate = [&](bool work) {
    if (!options.gate || (!work && !working)) return;
    working = work;
    try {
      options.gate(work);
    } catch (const std::exception& e) {
      log_text(LogLevel::kWarn, "lm", std::string("the batch engine's gate failed: ") + e.what());
    }
  };
  const auto has_work = [&] { return stopping || !submitted.empty() || !waiting.empty() || !running.empty(); };
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (!has_work() && working) {  // out of work: the gate lets go, outside the mutex
        lock.unlock();
        gate(false);
        lock.lock();
      }
      if (!has_work() && blocks) {
        // Idle: keep the pool (and its cached prefixes) a while, then give its memory back, to
        // the driver too (the caching allocator would keep it from the GPU's other processes).
        if (!wake.wait_for(lock, std::chrono::duration<double>(options.idle_release_s), has_work)) {
          drop_pool();
          counters.blocks = 0;
          if (model.device().is_cuda()) {
            lock.unlock();
            try {
              release_cached_cuda_memory();
            } catch (const std::exception& e) {
              log_text(LogLevel::kWarn, "lm",
                       std::string("the batch engine could not give its pool back: ") + e.what());
            }
            lock.lock();
          }
        }
      }
      wake.wait(lock, has_work);
      if (stopping) {
        for (auto& c : submitted) waiting.push_back(c);
        submitted.clear();
        break;
      }
      for (auto& c : submitted) waiting.push_back(c);
      submitted.clear();
    }
    gate(true);
    if (!blocks) {
      try {
        const int64_t count = options.kv_tokens / options.block_size;
        pool = model.new_paged_kv((count + 1) * options.block_size);
        blocks = std::make_unique<Blocks>(count);
        scratch = count;
        count_stats([&](lm::EngineStats& s) { s.blocks = count; });
      } catch (const std::exception&) {  // no memory for the pool: the calls waiting for it fail
        for (auto& c : waiting) finish(c, std::current_exception());
        waiting.clear();
        drop_pool();
        continue;
      }
    }
    try {
      admit();
      if (!running.empty()) step();
    } catch (const std::exception&) {
      // A failed forward (out of memory, ...): every call in flight fails with it; the pool's
      // content is unknown, so it goes too.
      const auto error = std::current_exception();
      for (auto& c : running) finish(c, error);
      running.clear();
      drop_pool();
    }
  }
  gate(false);
  const auto error = std::make_exception_ptr(Error("the language model's batch engine stopped before this call ran"));
  for (auto& c : running) finish(c, error);
  for (auto& c : waiting) finish(c, error);
}

// Blocks the call's live rows take when admitted: each row's whole length (its last token's
// position included), less the full prompt blocks an earlier row of the call fills first (its
// other rows reuse them) and, with count_held, those some running sequence holds already.
int64_t BatchEngine::Impl::blocks_needed(const Call& call, bool count_held) const {
  const int64_t bs = options.block_size;
  std::unordered_set<uint64_t> mine;
  int64_t need = 0;
  for (const Row& r : call.rows) {
    if (!r.live) continue;
    const int64_t len = static_cast<int64_t>(r.tokens.size()), full = (len - 1) / bs;
    need += blocks_for(len);
    uint64_t parent = 0, key = 0;
    for (int64_t i = 0; i < full; ++i) {
      const int64_t* tokens = r.tokens.data() + i * bs;
      key = block_hash(parent, tokens, bs);
      if (!mine.insert(key).second) {
        --need;
      } else if (count_held) {
        const int64_t b = blocks->find(parent, tokens, bs, &key);
        if (b >= 0 && blocks->refs(b) > 0) --need;
      }
      parent = key;
    }
  }
  return need;
}

void BatchEngine::Impl::admit() {
  int64_t live = 0;
  for (const auto& c : running) live += c->live_rows();
  std::vector<Row*> fresh;
  while (!waiting.empty()) {
    const CallPtr call = waiting.front();
    const int64_t need = blocks_needed(*call, false);
    if (need > blocks->count()) {
      size_t longest = 0;
      for (const Row& r : call->rows) longest = std::max(longest, r.tokens.size());
      waiting.pop_front();
      finish(call, std::make_exception_ptr(Error(fmt::format(
                       "generate: {} sequence(s) of up to {} tokens need {} KV blocks of {} positions; the batch "
                       "engine's pool holds {} ({} positions): raise the model's kv_tokens or shorten the prompts",
                       call->live_rows(), longest, need, options.block_size, blocks->count(),
                       blocks->count() * options.block_size))));
      continue;
    }
    const int64_t rows = call->live_rows();
    int64_t headroom = 0;  // a block for each running sequence to grow into, unless none runs
    for (const auto& c : running) headroom += c->live_rows();
    // A call of more rows than max_rows still runs, alone.
    const bool too_many = live + rows > options.max_rows && !running.empty();
    if (too_many || blocks_needed(*call, true) + headroom > blocks->available()) {
      count_stats([](lm::EngineStats& s) { ++s.waits; });
      break;  // first come, first served: the head waits, and so does everyone behind it
    }
    waiting.pop_front();
    for (Row& r : call->rows)
      if (r.live) {
        take_blocks(r);
        fresh.push_back(&r);
      }
    call->admitted = ++admissions;
    running.push_back(call);
    live += rows;
  }
  if (fresh.empty()) return;
  follow_other_threads();
  prefill(fresh);
  count_stats([&](lm::EngineStats& s) { s.peak_blocks = std::max(s.peak_blocks, blocks->held()); });
}

// New calls may come after weights changed on other threads (the learner's step, a snapshot's
// copy): the engine's stream waits for the default stream's work, and graphs captured with
// weights that have moved since are dropped.
void BatchEngine::Impl::follow_other_threads() {
  if (!model.device().is_cuda()) return;
  const auto index = model.device().index();
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getDefaultCUDAStream(index));
  ready.block(c10::cuda::getCurrentCUDAStream(index));
  std::vector<const void*> weights;
  for (const auto& p : model.parameters()) weights.push_back(p.data_ptr());
  if (weights != graph_weights) {
    graphs.clear();
    graph_pool.reset();
    graph_weights = std::move(weights);
  }
}

// Gives a row being admitted the blocks for all its positions: cached full blocks where their
// content is known (or promised by a row admitted before it), new ones for the rest. The full
// blocks its prefill fills are promised at once (known by content, pending until written), so
// that rows admitted after it (a PPO group's copies of one prompt) reuse them.
void BatchEngine::Impl::take_blocks(Row& row) {
  const int64_t bs = options.block_size;
  const int64_t n = static_cast<int64_t>(row.tokens.size()) - 1;
  uint64_t parent = 0, key = 0;
  while ((static_cast<int64_t>(row.blocks.size()) + 1) * bs <= n) {
    const int64_t b = blocks->find(parent, row.tokens.data() + row.blocks.size() * bs, bs, &key);
    if (b < 0) break;
    blocks->hold(b);
    row.blocks.push_back(b);
    row.keys.push_back(key);
    parent = key;
  }
  row.cached = static_cast<int64_t>(row.blocks.size()) * bs;
  const int64_t reused = row.cached;
  while (static_cast<int64_t>(row.blocks.size()) * bs < n + 1) {
    const int64_t b = blocks->take();
    CA_ASSERT(b >= 0, "admission: no free block after admission counted them");
    row.blocks.push_back(b);
  }
  remember_full_blocks(row, n, /*promise=*/true);
  count_stats([&](lm::EngineStats& s) {
    s.reused_tokens += reused;
    s.prefilled_tokens += n - reused;
  });
}

// Fills the pool with the keys and values of every token but the last of each row, in batched
// forwards. A row that reuses blocks another row still has to fill waits for a later wave.
void BatchEngine::Impl::prefill(const std::vector<Row*>& rows) {
  const auto end = [](const Row* r) { return static_cast<int64_t>(r->tokens.size()) - 1; };
  std::vector<Row*> todo;
  for (Row* r : rows)
    if (r->cached < end(r)) todo.push_back(r);
  while (!todo.empty()) {
    std::vector<Row*> wave, later;
    for (Row* r : todo) {
      bool ready = true;
      for (int64_t i = 0; ready && i < r->cached / options.block_size; ++i) ready = pending.count(r->blocks[i]) == 0;
      (ready ? wave : later).push_back(r);
    }
    CA_ASSERT(!wave.empty(), "prefill: {} rows wait for blocks no row fills", later.size());
    while (!wave.empty()) {
      // As many rows as fit one forward, each advancing up to prefill_chunk tokens.
      std::vector<Row*> batch;
      int64_t len = 0, keys = 0;
      for (Row* r : wave) {
        const int64_t l = std::min(options.prefill_chunk, end(r) - r->cached);
        const int64_t n = static_cast<int64_t>(batch.size()) + 1, lmax = std::max(len, l),
                      kmax = std::max(keys, r->cached + l);
        if (!batch.empty() && (n * lmax > kPrefillTokens || n * lmax * kmax > kPrefillMask)) break;
        batch.push_back(r);
        len = lmax;
        keys = kmax;
      }
      prefill_forward(batch, len, keys);
      std::vector<Row*> rest;
      for (Row* r : wave) {
        if (r->cached < end(r)) {
          rest.push_back(r);
        } else {
          for (int64_t b : r->promised) pending.erase(b);
          r->promised.clear();
        }
      }
      wave = std::move(rest);
    }
    todo = std::move(later);
  }
}

// One forward over the next up to prefill_chunk prompt tokens of each row, padded to `len` new
// tokens and `keys` keys. Padding tokens sit at position 0, write to the scratch block and see
// only their row's first key.
void BatchEngine::Impl::prefill_forward(const std::vector<Row*>& rows, int64_t len, int64_t keys) {
  const int64_t n = static_cast<int64_t>(rows.size()), bs = options.block_size, width = blocks_for(keys);
  std::vector<int64_t> ids(n * len, 0), positions(n * len, 0), write(n * len, scratch * bs),
      table(n * width, scratch);
  std::vector<int64_t> took(n);
  for (int64_t i = 0; i < n; ++i) {
    Row& r = *rows[i];
    took[i] = std::min(options.prefill_chunk, static_cast<int64_t>(r.tokens.size()) - 1 - r.cached);
    for (int64_t j = 0; j < took[i]; ++j) {
      const int64_t p = r.cached + j;
      ids[i * len + j] = r.tokens[p];
      positions[i * len + j] = p;
      write[i * len + j] = slot(r, p);
    }
    std::copy(r.blocks.begin(), r.blocks.begin() + std::min<int64_t>(width, static_cast<int64_t>(r.blocks.size())),
              table.begin() + i * width);
  }
  const auto dev_table = on_device(table).view({n, width});
  const auto read = (dev_table.unsqueeze(-1) * bs + torch::arange(bs, dev_table.options())).view({n, width * bs});
  const auto pos = on_device(positions).view({n, len});
  const auto allowed =
      (torch::arange(width * bs, pos.options()).view({1, 1, -1}) <= pos.unsqueeze(-1)).view({n, 1, len, width * bs});
  model.forward_paged(on_device(ids).view({n, len}), pos, pool, on_device(write), read, allowed);
  for (int64_t i = 0; i < n; ++i) rows[i]->cached += took[i];
}

// The row's full blocks below position `upto` become reusable by content. With promise, they
// are about to be filled by this row's prefill: pending until then.
void BatchEngine::Impl::remember_full_blocks(Row& row, int64_t upto, bool promise) {
  const int64_t bs = options.block_size;
  while (static_cast<int64_t>(row.keys.size()) < upto / bs) {
    const int64_t i = static_cast<int64_t>(row.keys.size());
    const uint64_t parent = i == 0 ? 0 : row.keys.back();
    const int64_t* tokens = row.tokens.data() + i * bs;
    const uint64_t key = block_hash(parent, tokens, bs);
    if (blocks->remember(row.blocks[i], parent, key, tokens, bs) && promise) {
      pending.insert(row.blocks[i]);
      row.promised.push_back(row.blocks[i]);
    }
    row.keys.push_back(key);
  }
}

// A block for the row's next position, taken from the most recently admitted other call when
// none is free. False when the row's own call had to go back to the queue (it was the newest).
bool BatchEngine::Impl::make_room(Call& call, Row& row) {
  while (static_cast<int64_t>(row.blocks.size()) * options.block_size <= row.cached) {
    const int64_t b = blocks->take();
    if (b >= 0) {
      row.blocks.push_back(b);
      continue;
    }
    CallPtr newest;
    for (const auto& c : running)
      if (!newest || c->admitted > newest->admitted) newest = c;
    CA_ASSERT(newest != nullptr, "no running call to take a block from");
    const bool self = newest.get() == &call;
    CA_CHECK(!self || running.size() > 1,
             "generate: the sequences outgrew the batch engine's KV pool ({} positions) at {} tokens: raise the "
             "model's kv_tokens or lower max_new_tokens",
             blocks->count() * options.block_size, row.cached + 1);
    preempt(newest);
    if (self) return false;
  }
  return true;
}

void BatchEngine::Impl::free_rows(Call& call) {
  for (Row& r : call.rows) {
    for (int64_t b : r.blocks) blocks->release(b);
    r.blocks.clear();
    r.keys.clear();
    r.promised.clear();
    r.cached = 0;
  }
}

void BatchEngine::Impl::preempt(const CallPtr& call) {
  free_rows(*call);
  running.erase(std::find(running.begin(), running.end(), call));
  waiting.push_front(call);
  count_stats([](lm::EngineStats& s) { ++s.preemptions; });
}

void BatchEngine::Impl::step() {
  // Every live row needs a slot for the token it feeds now.
  for (size_t i = 0; i < running.size();) {
    const CallPtr call = running[i];
    bool stays = true;
    for (Row& r : call->rows)
      if (r.live && !(stays = make_room(*call, r))) break;
    if (stays && i < running.size() && running[i] == call) ++i;
    // else the call (or one after it) went back to the queue: running[i] is the next one
  }
  if (running.empty()) return;

  struct Live {
    Call* call;
    Row* row;
  };
  std::vector<Live> batch;
  int64_t keys = 0;
  for (const auto& c : running)
    for (Row& r : c->rows)
      if (r.live) {
        batch.push_back({c.get(), &r});
        keys = std::max(keys, r.cached + 1);
      }
  const int64_t rows = static_cast<int64_t>(batch.size()), bs = options.block_size;
  const int64_t padded = row_bucket(rows), bucket = (kKeyBucket + bs - 1) / bs * bs;
  const int64_t width = (keys + bucket - 1) / bucket * bucket / bs;
  // One buffer: ids, positions, write slots, lengths and the sampler's uniforms (float64 bits)
  // ([padded] each), then the block table [padded, width]. Padding rows feed token 0 at position
  // 0 into the scratch block and see its first slot; padded table entries point at the scratch
  // block, masked out.
  std::vector<int64_t> input(static_cast<size_t>(padded * (kStepFields + width)), 0);
  int64_t* ids = input.data();
  int64_t* positions = ids + padded;
  int64_t* write = positions + padded;
  int64_t* lengths = write + padded;
  int64_t* uniform_bits = lengths + padded;
  int64_t* table = uniform_bits + padded;
  std::fill(write, lengths, scratch * bs);
  std::fill(lengths, uniform_bits, 1);
  std::fill(table, input.data() + input.size(), scratch);
  for (int64_t i = 0; i < rows; ++i) {
    const Row& r = *batch[i].row;
    ids[i] = r.tokens.back();
    positions[i] = r.cached;
    write[i] = slot(r, r.cached);
    lengths[i] = r.cached + 1;
    std::copy(r.blocks.begin(), r.blocks.begin() + std::min<int64_t>(width, static_cast<int64_t>(r.blocks.size())),
              table + i * width);
  }

  // Sampling: each call's rows by its own sampler (its draws in its rows' order), rows of calls
  // with equal options in one pass. The common step has one pass: the decode samples too (on a
  // GPU inside the step's graph), and the step copies its tokens and log-probs back at once.
  std::vector<double> uniforms(static_cast<size_t>(padded), 0.5);
  std::map<SampleKey, std::vector<int64_t>> passes;
  for (int64_t i = 0; i < rows;) {
    Call* call = batch[i].call;
    int64_t end = i;
    while (end < rows && batch[end].call == call) ++end;
    auto& pass = passes[sample_key(call->options)];
    for (int64_t j = i; j < end; ++j) pass.push_back(j);
    call->sampler.draw_into(end - i, uniforms.data() + i);
    i = end;
  }
  std::memcpy(uniform_bits, uniforms.data(), uniforms.size() * sizeof(double));
  const std::optional<SampleKey> one_pass =
      passes.size() == 1 ? std::optional<SampleKey>(passes.begin()->first) : std::nullopt;
  const auto started = std::chrono::steady_clock::now();
  const auto out = decode(padded, width, input, one_pass);
  std::vector<int64_t> token(rows);
  std::vector<float> logprob(rows);
  double waited = 0;
  const auto read = [&](const torch::Tensor& chosen, const std::vector<int64_t>& index) {
    const auto before = std::chrono::steady_clock::now();
    const auto picks = Sampler::read_picks(chosen, static_cast<int64_t>(index.size()));
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
    for (size_t j = 0; j < index.size(); ++j) {
      token[index[j]] = picks.tokens[j];
      logprob[index[j]] = picks.logprobs[j];
    }
  };
  if (one_pass) {
    read(out, passes.begin()->second);
  } else {
    const auto logits = out.narrow(0, 0, rows);
    const auto u = torch::from_blob(uniforms.data(), {padded}, torch::kFloat64).to(logits.device());
    for (const auto& [key, index] : passes) {
      const auto at = on_device(index);
      read(Sampler::choose(sampling_of(key), logits.index_select(0, at), u.index_select(0, at)), index);
    }
  }
  for (auto& l : batch) {
    ++l.row->cached;
    remember_full_blocks(*l.row, l.row->cached, /*promise=*/false);
  }

  std::vector<CallPtr> ended;
  for (const auto& c : running) {
    try {
      for (int64_t i = 0; i < rows; ++i) {
        if (batch[i].call != c.get()) continue;
        Row& r = *batch[i].row;
        const bool go_on = !c->on_token || c->on_token(r.index, token[i]);
        if (take_token(c->results[r.index], c->options, token[i], logprob[i], go_on)) {
          r.tokens.push_back(token[i]);
        } else {
          r.live = false;
          for (int64_t b : r.blocks) blocks->release(b);
          r.blocks.clear();
        }
      }
      if (c->live_rows() == 0) ended.push_back(c);
    } catch (const std::exception&) {  // on_token threw: that call ends with its error
      free_rows(*c);
      finish(c, std::current_exception());
      ended.push_back(c);
      c->rows.clear();
    }
  }
  // Counted before the calls are released: a caller reads the stats of what it waited for.
  count_stats([&](lm::EngineStats& s) {
    ++s.steps;
    if (paged_kernel) ++s.paged_steps;
    s.decoded_tokens += rows;
    s.peak_rows = std::max(s.peak_rows, rows);
    s.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    s.device_wait_seconds += waited;
  });
  for (const auto& c : ended) {
    if (!c->rows.empty()) finish(c, nullptr);
    running.erase(std::find(running.begin(), running.end(), c));
  }
}

// One decode step whose inputs `input` holds (step()): the logits [rows, vocab] (float32), or
// with `sample` the picks of that sampling pass (Sampler::choose: float64 [2, rows]) made with the
// uniforms in `input`. On a GPU, each shape's first step runs eagerly (its result, and the
// capture's warm-up) and is then captured as a CUDA graph that later steps of that shape replay.
// The tensor returned is overwritten by the next step.
torch::Tensor BatchEngine::Impl::decode(int64_t rows, int64_t width, const std::vector<int64_t>& input,
                                        const std::optional<SampleKey>& sample) {
  const auto host = torch::from_blob(const_cast<int64_t*>(input.data()), {static_cast<int64_t>(input.size())},
                                     torch::kInt64);
  if (!use_graphs) return decode_forward(rows, width, host.to(model.device()), sample);
  const GraphShape shape{rows, width, sample};
  const auto found = graphs.find(shape);
  if (found != graphs.end()) {
    found->second.input.copy_(host);
    found->second.graph->replay();
    return graph_out.at({rows, sample});
  }
  Graph g;
  g.input = host.to(model.device());
  auto result = decode_forward(rows, width, g.input, sample);
  auto& out = graph_out[{rows, sample}];
  if (!out.defined()) out = torch::empty_like(result);
  if (!graph_pool) graph_pool = at::cuda::graph_pool_handle();
  g.graph = std::make_unique<at::cuda::CUDAGraph>();
  // Thread-local capture: other threads (the learner, evaluations) go on allocating meanwhile,
  // but no cached memory is given back until it ends (cuda_memory.h).
  const auto capturing = graph_capture_guard();
  g.graph->capture_begin(*graph_pool, cudaStreamCaptureModeThreadLocal);
  try {
    out.copy_(decode_forward(rows, width, g.input, sample));
  } catch (...) {
    // End the broken capture so that the stream works again; this engine decodes eagerly from now.
    cudaGraph_t broken = nullptr;
    if (cudaStreamEndCapture(c10::cuda::getCurrentCUDAStream(model.device().index()), &broken) == cudaSuccess &&
        broken != nullptr)
      cudaGraphDestroy(broken);
    use_graphs = false;
    throw;
  }
  g.graph->capture_end();
  graphs.emplace(shape, std::move(g));
  return result;
}

torch::Tensor BatchEngine::Impl::decode_forward(int64_t rows, int64_t width, const torch::Tensor& input,
                                                const std::optional<SampleKey>& sample) {
  const int64_t bs = options.block_size, keys = width * bs;
  const auto ids = input.narrow(0, 0, rows).view({rows, 1});
  const auto positions = input.narrow(0, rows, rows).view({rows, 1});
  const auto write = input.narrow(0, 2 * rows, rows);
  const auto lengths = input.narrow(0, 3 * rows, rows);
  const auto uniforms = input.narrow(0, 4 * rows, rows).view(torch::kFloat64);
  const auto table = input.narrow(0, kStepFields * rows, rows * width).view({rows, width});
  torch::Tensor hidden;
  if (paged_kernel) {  // attention reads the pool through the block table
    try {
      hidden = model.decode_paged(ids, positions, pool, write, table, lengths, bs);
    } catch (const Error& e) {
      // The kernel would not launch here: this step's calls fail with its error, later steps
      // attend as without it (graphs captured with it go too). A failed launch comes from a first,
      // eager step of its shape, before any capture of that shape.
      paged_kernel = false;
      graphs.clear();
      graph_out.clear();
      log_text(LogLevel::kWarn, "lm",
               std::string("the batch engine's paged attention failed; its decode steps gather keys from now: ") +
                   e.what());
      throw;
    }
  } else {  // each row's keys gathered, padded positions masked
    const auto read = (table.unsqueeze(-1) * bs + torch::arange(bs, table.options())).view({rows, keys});
    const auto allowed =
        (torch::arange(keys, table.options()).unsqueeze(0) < lengths.unsqueeze(1)).view({rows, 1, 1, keys});
    hidden = model.forward_paged(ids, positions, pool, write, read, allowed);
  }
  const auto logits = model.logits(hidden.select(1, 0)).to(torch::kFloat32);
  return sample ? Sampler::choose(sampling_of(*sample), logits, uniforms) : logits;
}

void BatchEngine::Impl::finish(const CallPtr& call, std::exception_ptr error) {
  if (error) {
    call->done.set_exception(error);
  } else {
    call->done.set_value();
  }
}

BatchEngine::BatchEngine(CausalLMImpl& model, EngineOptions options) : impl_(std::make_unique<Impl>(model, options)) {
  CA_CHECK(options.block_size >= 1 && options.block_size <= 4096, "kv_block {} must be in [1, 4096]",
           options.block_size);
  CA_CHECK(options.kv_tokens >= options.block_size, "kv_tokens {} must hold at least one block of {} positions",
           options.kv_tokens, options.block_size);
  CA_CHECK(options.max_rows >= 1 && options.prefill_chunk >= 1, "max_rows {} and prefill_chunk {} must be positive",
           options.max_rows, options.prefill_chunk);
  impl_->worker = std::thread([this] { impl_->loop(); });
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  impl_->worker.join();
}

std::vector<lm::Generation> BatchEngine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                  const lm::SamplingOptions& options,
                                                  const std::function<bool(size_t, int64_t)>& on_token) {
  auto call = std::make_shared<Call>(options, on_token);  // the Sampler checks the options
  call->results.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    CA_CHECK(!prompts[i].empty(), "prompt {} is empty: a prompt needs at least one token (e.g. the BOS token)", i);
    check_tokens(impl_->model.config(), prompts[i], fmt::format("prompt {}", i));
    Row r;
    r.index = i;
    r.tokens = prompts[i];
    call->rows.push_back(std::move(r));
  }
  if (prompts.empty()) return {};
  if (options.max_new_tokens == 0) {
    for (auto& r : call->results) r.finish_reason = "length";
    return call->results;
  }
  auto done = call->done.get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    CA_CHECK(!impl_->stopping, "generate: the batch engine is stopping");
    impl_->submitted.push_back(call);
  }
  impl_->wake.notify_all();
  done.get();  // rethrows the call's error
  return std::move(call->results);
}

lm::EngineStats BatchEngine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->counters;
}

}  // namespace cuda_agent::lm

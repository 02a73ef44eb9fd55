#include "batch_engine.h"
#include "torch_fmt.h"  // first: see there

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "cuda_agent/core/error.h"
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

  // Block b (held, now full) holds `tokens` after the block keyed `parent`.
  void remember(int64_t b, uint64_t parent, uint64_t key, const int64_t* tokens, int64_t n) {
    if (cached_[b].valid || by_key_.count(key)) return;  // already known (another copy is enough)
    cached_[b] = {true, key, parent, std::vector<int64_t>(tokens, tokens + n)};
    by_key_[key] = b;
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
  int64_t admissions = 0;
  std::thread worker;

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

  void loop();
  void admit();
  int64_t blocks_needed(const Call& call, bool count_held) const;
  void prefill(Row& row);
  void remember_full_blocks(Row& row);
  bool make_room(Call& call, Row& row);
  void preempt(const CallPtr& call);
  void step();
  void finish(const CallPtr& call, std::exception_ptr error);
  void free_rows(Call& call);
};

void BatchEngine::Impl::loop() {
  c10::InferenceMode inference;
  c10::DeviceGuard device(model.device());
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      const auto has_work = [&] { return stopping || !submitted.empty() || !waiting.empty() || !running.empty(); };
      if (!has_work() && blocks) {
        // Idle: keep the pool (and its cached prefixes) a while, then give its memory back.
        if (!wake.wait_for(lock, std::chrono::duration<double>(options.idle_release_s), has_work)) {
          blocks.reset();
          pool = PagedKv{};
          counters.blocks = 0;
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
    if (!blocks) {
      try {
        const int64_t count = options.kv_tokens / options.block_size;
        pool = model.new_paged_kv(count * options.block_size);
        blocks = std::make_unique<Blocks>(count);
        count_stats([&](lm::EngineStats& s) { s.blocks = count; });
      } catch (const std::exception&) {  // no memory for the pool: the calls waiting for it fail
        for (auto& c : waiting) finish(c, std::current_exception());
        waiting.clear();
        pool = PagedKv{};
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
      blocks.reset();
      pool = PagedKv{};
    }
  }
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
      return;  // first come, first served: the head waits, and so does everyone behind it
    }
    waiting.pop_front();
    for (Row& r : call->rows)
      if (r.live) prefill(r);
    call->admitted = ++admissions;
    running.push_back(call);
    live += rows;
  }
}

// Fills the pool with the keys and values of every token of `row` but its last: cached full
// blocks where the content is known, a forward over the rest (in chunks), and the blocks for
// them and for the last token's position.
void BatchEngine::Impl::prefill(Row& row) {
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
    CA_ASSERT(b >= 0, "prefill: no free block after admission counted them");
    row.blocks.push_back(b);
  }
  const auto dev = model.device();
  for (int64_t start = row.cached; start < n; start += options.prefill_chunk) {
    const int64_t len = std::min(options.prefill_chunk, n - start), keys = start + len;
    std::vector<int64_t> ids(row.tokens.begin() + start, row.tokens.begin() + keys), write, read;
    for (int64_t p = start; p < keys; ++p) write.push_back(slot(row, p));
    for (int64_t p = 0; p < keys; ++p) read.push_back(slot(row, p));
    const auto positions = torch::arange(start, keys, torch::TensorOptions().dtype(torch::kInt64).device(dev));
    const auto key_pos = torch::arange(keys, positions.options());
    const auto allowed = (key_pos.unsqueeze(0) <= positions.unsqueeze(1)).view({1, 1, len, keys});
    model.forward_paged(on_device(ids).view({1, len}), positions.view({1, len}), pool, on_device(write),
                        on_device(read).view({1, keys}), allowed);
    row.cached = keys;
    remember_full_blocks(row);
  }
  count_stats([&](lm::EngineStats& s) {
    s.reused_tokens += reused;
    s.prefilled_tokens += n - reused;
    s.peak_blocks = std::max(s.peak_blocks, blocks->held());
  });
}

// The row's blocks that filled up since the last call become reusable by content.
void BatchEngine::Impl::remember_full_blocks(Row& row) {
  const int64_t bs = options.block_size;
  while (static_cast<int64_t>(row.keys.size()) < row.cached / bs) {
    const int64_t i = static_cast<int64_t>(row.keys.size());
    const uint64_t parent = i == 0 ? 0 : row.keys.back();
    const int64_t* tokens = row.tokens.data() + i * bs;
    const uint64_t key = block_hash(parent, tokens, bs);
    blocks->remember(row.blocks[i], parent, key, tokens, bs);
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
    r.cached = 0;
  }
}

void BatchEngine::Impl::preempt(const CallPtr& call) {
  free_rows(*call);
  running.erase(std::find(running.begin(), running.end(), call));
  waiting.push_front(call);
  count_stats([](lm::EngineStats& s) { ++s.preemptions; });
}

// Decode steps pad the keys they attend over to a multiple of this many positions (step()).
constexpr int64_t kKeyBucket = 256;

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
  // The keys read are padded to a multiple of kKeyBucket positions (masked out), so that the
  // attention's shapes change once every kKeyBucket steps, not at every step: libraries that
  // plan per shape (cuDNN's attention, cuBLAS's heuristics) then reuse their plans. The padded
  // table entries are block 0, whose slots exist; the mask hides them.
  const int64_t bucket = (kKeyBucket + bs - 1) / bs * bs;
  keys = (keys + bucket - 1) / bucket * bucket;
  const int64_t width = keys / bs;
  std::vector<int64_t> ids, positions, write, lengths, table(static_cast<size_t>(rows * width), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const Row& r = *batch[i].row;
    ids.push_back(r.tokens.back());
    positions.push_back(r.cached);
    write.push_back(slot(r, r.cached));
    lengths.push_back(r.cached + 1);
    std::copy(r.blocks.begin(), r.blocks.begin() + std::min<int64_t>(width, static_cast<int64_t>(r.blocks.size())),
              table.begin() + i * width);
  }
  const auto dev_table = on_device(table).view({rows, width});
  const auto within = torch::arange(bs, dev_table.options());
  const auto read = (dev_table.unsqueeze(-1) * bs + within).view({rows, width * bs}).narrow(1, 0, keys);
  const auto allowed = (torch::arange(keys, dev_table.options()).unsqueeze(0) < on_device(lengths).unsqueeze(1))
                           .view({rows, 1, 1, keys});
  const auto hidden = model.forward_paged(on_device(ids).view({rows, 1}), on_device(positions).view({rows, 1}), pool,
                                          on_device(write), read, allowed);
  const auto logits = model.logits(hidden.select(1, 0)).to(torch::kFloat32);
  for (auto& l : batch) {
    ++l.row->cached;
    remember_full_blocks(*l.row);
  }

  // Sampling: each call's rows by its own sampler (its draws in its rows' order), rows of calls
  // with equal options in one pass.
  using Key = std::tuple<bool, double, int64_t, double>;
  std::map<Key, std::pair<std::vector<int64_t>, std::vector<torch::Tensor>>> passes;
  for (int64_t i = 0; i < rows;) {
    Call* call = batch[i].call;
    int64_t end = i;
    while (end < rows && batch[end].call == call) ++end;
    const auto& o = call->options;
    const bool greedy = o.greedy || o.temperature == 0.0;
    auto& pass = passes[Key{greedy, greedy ? 0.0 : o.temperature, greedy ? 0 : o.top_k, greedy ? 1.0 : o.top_p}];
    for (int64_t j = i; j < end; ++j) pass.first.push_back(j);
    if (!greedy) pass.second.push_back(call->sampler.draw(end - i));
    i = end;
  }
  std::vector<int64_t> token(rows);
  std::vector<float> logprob(rows);
  for (auto& [key, pass] : passes) {
    const auto& [index, uniforms] = pass;
    lm::SamplingOptions o;
    std::tie(o.greedy, o.temperature, o.top_k, o.top_p) = key;
    const auto part = static_cast<int64_t>(index.size()) == rows ? logits : logits.index_select(0, on_device(index));
    const auto picks = Sampler::pick_with(o, part, uniforms.empty() ? torch::Tensor() : torch::cat(uniforms));
    for (size_t j = 0; j < index.size(); ++j) {
      token[index[j]] = picks.tokens[j];
      logprob[index[j]] = picks.logprobs[j];
    }
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
    s.decoded_tokens += rows;
    s.peak_rows = std::max(s.peak_rows, rows);
  });
  for (const auto& c : ended) {
    if (!c->rows.empty()) finish(c, nullptr);
    running.erase(std::find(running.begin(), running.end(), c));
  }
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

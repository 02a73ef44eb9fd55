#include "torch_fmt.h"  // first: see there
#include "generation.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>

#include "cuda_agent/core/error.h"
#include "cuda_memory.h"
#include "sampling.h"

namespace cuda_agent::lm {
namespace {

torch::Tensor to_device(const std::vector<int64_t>& values, torch::Device device) {
  return torch::tensor(values, torch::kInt64).to(device);
}

// Prompts of one length, prefilled together: one forward, no padding (so causal attention needs
// no mask). Returns their cache rows and the logits after each prompt's last token.
std::pair<KvCache, torch::Tensor> prefill(CausalLMImpl& model, const std::vector<const std::vector<int64_t>*>& group) {
  const int64_t rows = static_cast<int64_t>(group.size()), len = static_cast<int64_t>(group[0]->size());
  std::vector<int64_t> flat;
  flat.reserve(static_cast<size_t>(rows * len));
  for (const auto* p : group) flat.insert(flat.end(), p->begin(), p->end());
  KvCache cache = model.new_cache(rows, len);
  auto ids = to_device(flat, model.device()).view({rows, len});
  auto positions = torch::arange(len, ids.options()).unsqueeze(0).expand({rows, len}).contiguous();
  auto hidden = model.forward(ids, positions, &cache);
  return {std::move(cache), model.logits(hidden.select(1, len - 1)).to(torch::kFloat32)};
}

// Most prompt tokens one prefill forward takes at once (bounds its activations and logits).
constexpr int64_t kPrefillTokens = 16384;

// Static decoding attends over the cache in buckets of this many positions: one CUDA graph per
// bucket in use, each reading only the positions its steps can have filled.
constexpr int64_t kGraphBucket = 256;
// Rows x positions above which decoding stays eager (the static cache holds prompt + every new
// token of every row from the start).
constexpr int64_t kGraphMaxCacheTokens = 1 << 19;

// The decode steps of one generate() call replayed from CUDA graphs: the whole batch, finished
// rows included (their tokens are ignored), so that shapes never change. Each bucket's first step
// runs eagerly on the capture stream (the warm-up capture needs, and a real step), and is then
// captured; later steps in the bucket replay it. Inputs and outputs live in static tensors.
class GraphDecoder {
 public:
  GraphDecoder(CausalLMImpl& model, KvCache& cache, torch::Tensor valid, torch::Tensor positions, int64_t slot)
      : model_(model), cache_(cache), valid_(std::move(valid)), positions_(std::move(positions)), next_slot_(slot) {
    slot_ = torch::full({1}, slot, positions_.options());
    ids_ = torch::zeros({cache.batch(), 1}, positions_.options());
  }

  // Logits [B, vocab] float32 for the next token of every row, given each row's last token.
  // The tensor is overwritten by the next call.
  torch::Tensor step(const std::vector<int64_t>& tokens) {
    ids_.copy_(torch::tensor(tokens, torch::kInt64).view({-1, 1}));
    const int64_t keys = std::min(cache_.capacity(), (next_slot_ / kGraphBucket + 1) * kGraphBucket);
    ++next_slot_;
    auto found = graphs_.find(keys);
    if (found != graphs_.end()) {
      found->second.graph->replay();
      return found->second.logits;
    }
    auto logits = run(keys);  // eager: this step's real work, and the capture's warm-up
    // The capture records the same step without running it (the in-place updates of positions,
    // slot, valid and the cache included); replays run it for the next steps of the bucket.
    Captured c;
    c.graph = std::make_unique<at::cuda::CUDAGraph>();
    // Thread-local capture: other threads (eval runs one episode per GPU in threads of one
    // process) keep loading models and allocating while this one captures; no cached memory is
    // given back until it ends (cuda_memory.h).
    {
      const auto capturing = graph_capture_guard();
      c.graph->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
      c.logits = run(keys);
      c.graph->capture_end();
    }
    graphs_.emplace(keys, std::move(c));
    return logits;
  }

 private:
  struct Captured {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    torch::Tensor logits;
  };
  torch::Tensor run(int64_t keys) {
    auto hidden = model_.decode_static(ids_, positions_, cache_, valid_, slot_, keys);
    return model_.logits(hidden.select(1, 0)).to(torch::kFloat32);
  }

  CausalLMImpl& model_;
  KvCache& cache_;
  torch::Tensor valid_, positions_, slot_, ids_;
  int64_t next_slot_;
  at::cuda::MempoolId_t pool_ = at::cuda::graph_pool_handle();
  std::map<int64_t, Captured> graphs_;
};

}  // namespace

bool take_token(lm::Generation& out, const lm::SamplingOptions& options, int64_t token, float logprob, bool go_on) {
  out.tokens.push_back(token);
  out.logprobs.push_back(logprob);
  const auto& stops = options.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end())
    out.finish_reason = "stop";
  else if (!go_on)
    out.finish_reason = "callback";
  else if (static_cast<int64_t>(out.tokens.size()) >= options.max_new_tokens)
    out.finish_reason = "length";
  else
    return true;
  return false;
}

void check_tokens(const policy::ModelConfig& config, const std::vector<int64_t>& tokens, const std::string& what) {
  for (size_t i = 0; i < tokens.size(); ++i)
    CA_CHECK(tokens[i] >= 0 && tokens[i] < config.vocab_size,
             "{}: token {} at position {} is outside the vocabulary [0, {}); check the tokenizer matches the model",
             what, tokens[i], i, config.vocab_size);
}

std::vector<lm::Generation> generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                     const lm::SamplingOptions& options,
                                     const std::function<bool(size_t, int64_t)>& on_token) {
  Sampler sampler(options);
  const int64_t n = static_cast<int64_t>(prompts.size());
  std::vector<lm::Generation> results(n);
  for (int64_t i = 0; i < n; ++i) {
    CA_CHECK(!prompts[i].empty(), "prompt {} is empty: a prompt needs at least one token (e.g. the BOS token)", i);
    check_tokens(model.config(), prompts[i], fmt::format("prompt {}", i));
  }
  if (n == 0) return results;
  if (options.max_new_tokens == 0) {
    for (auto& r : results) r.finish_reason = "length";
    return results;
  }
  c10::InferenceMode inference;
  const auto device = model.device();
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  std::vector<int64_t> pad(n);
  for (int64_t i = 0; i < n; ++i) pad[i] = longest - static_cast<int64_t>(prompts[i].size());

  // Decode from CUDA graphs where they can run: a CUDA model, RoPE that needs no host reads, and
  // a static cache (every row's prompt and new tokens) of bounded size.
  const bool graphs = options.cuda_graphs && device.is_cuda() && model.config().rope_scaling.type != "dynamic" &&
                      n * (longest + options.max_new_tokens) <= kGraphMaxCacheTokens;
  // Prefill each distinct prompt once, prompts of equal length together in batches of up to
  // kPrefillTokens tokens, and place the rows, left-padded, in the batched cache.
  KvCache cache = model.new_cache(
      n, longest + (graphs ? options.max_new_tokens : std::min<int64_t>(options.max_new_tokens, 256)));
  auto logits = torch::empty({n, model.config().vocab_size}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  std::map<std::vector<int64_t>, std::vector<int64_t>> same;  // distinct prompt -> its rows
  for (int64_t i = 0; i < n; ++i) same[prompts[i]].push_back(i);
  std::map<int64_t, std::vector<const std::vector<int64_t>*>> by_length;
  for (const auto& entry : same) by_length[static_cast<int64_t>(entry.first.size())].push_back(&entry.first);
  for (const auto& [len, distinct] : by_length) {
    const size_t per_batch = static_cast<size_t>(std::max<int64_t>(1, kPrefillTokens / len));
    for (size_t start = 0; start < distinct.size(); start += per_batch) {
      const std::vector<const std::vector<int64_t>*> group(distinct.begin() + static_cast<std::ptrdiff_t>(start),
                                                           distinct.begin() + static_cast<std::ptrdiff_t>(std::min(distinct.size(), start + per_batch)));
      auto [part, part_logits] = prefill(model, group);
      // Row j of the part goes to every batch row holding that prompt; equal length means equal padding.
      std::vector<int64_t> source, target;
      for (size_t j = 0; j < group.size(); ++j)
        for (int64_t row : same.at(*group[j])) {
          source.push_back(static_cast<int64_t>(j));
          target.push_back(row);
        }
      const auto from = to_device(source, device), to = to_device(target, device);
      const int64_t at = longest - len;
      for (size_t l = 0; l < cache.k.size(); ++l) {
        cache.k[l].narrow(2, at, len).index_copy_(0, to, part.k[l].index_select(0, from));
        cache.v[l].narrow(2, at, len).index_copy_(0, to, part.v[l].index_select(0, from));
      }
      logits.index_copy_(0, to, part_logits.index_select(0, from));
    }
  }
  cache.length = longest;
  auto pad_t = to_device(pad, device);
  // [n, longest]; for graphs [n, capacity], the positions to come false until written.
  auto valid = torch::arange(graphs ? cache.capacity() : longest, pad_t.options()).unsqueeze(0) >= pad_t.unsqueeze(1);
  if (graphs) valid.narrow(1, longest, cache.capacity() - longest).fill_(false);
  std::vector<int64_t> next_pos(n);
  for (int64_t i = 0; i < n; ++i) next_pos[i] = static_cast<int64_t>(prompts[i].size());
  auto positions = to_device(next_pos, device).unsqueeze(1);

  // Appends a sampled token to prompt r's result; true when that row goes on.
  const auto take = [&](int64_t r, int64_t token, float logprob) {
    return take_token(results[r], options, token, logprob, !on_token || on_token(static_cast<size_t>(r), token));
  };
  if (graphs) {
    // Every row stays in the batch until all are done; a finished row's tokens are dropped.
    // Captures need a stream of their own; it starts after the prefill's work on the current one.
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
    c10::cuda::CUDAStreamGuard on_side_stream(c10::cuda::getStreamFromPool(false, device.index()));
    GraphDecoder decoder(model, cache, valid, positions, longest);
    // The sampler sees the live rows only, in order, as in eager decoding, so that seeded
    // sampling draws the same numbers for the same rows with and without graphs.
    std::vector<int64_t> live(n), feed(n, 0);
    std::iota(live.begin(), live.end(), 0);
    while (true) {
      auto picks = sampler.pick(static_cast<int64_t>(live.size()) == n ? logits
                                                                          : logits.index_select(0, to_device(live, device)));
      std::vector<int64_t> still;
      for (size_t j = 0; j < live.size(); ++j) {
        if (take(live[j], picks.tokens[j], picks.logprobs[j])) still.push_back(live[j]);
        feed[live[j]] = picks.tokens[j];
      }
      if (still.empty()) break;
      live = std::move(still);
      logits = decoder.step(feed);
    }
    return results;
  }

  std::vector<int64_t> rows(n);  // live batch row -> prompt index
  std::iota(rows.begin(), rows.end(), 0);
  while (true) {
    auto picks = sampler.pick(logits);
    std::vector<int64_t> keep, keep_tokens;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (take(rows[r], picks.tokens[r], picks.logprobs[r])) {
        keep.push_back(static_cast<int64_t>(r));
        keep_tokens.push_back(picks.tokens[r]);
      }
    }
    if (keep.empty()) break;
    if (keep.size() < rows.size()) {
      auto index = to_device(keep, device);
      cache.select_rows(index);
      valid = valid.index_select(0, index);
      positions = positions.index_select(0, index);
      std::vector<int64_t> live;
      for (int64_t r : keep) live.push_back(rows[r]);
      rows = std::move(live);
    }
    const int64_t batch = static_cast<int64_t>(rows.size());
    valid = torch::cat({valid, torch::ones({batch, 1}, valid.options())}, 1);
    const bool padded = std::any_of(rows.begin(), rows.end(), [&](int64_t i) { return pad[i] > 0; });
    auto mask = padded ? valid.view({batch, 1, 1, valid.size(1)}) : torch::Tensor();
    auto hidden = model.forward(to_device(keep_tokens, device).unsqueeze(1), positions, &cache, mask);
    logits = model.logits(hidden.select(1, 0)).to(torch::kFloat32);
    positions = positions + 1;
  }
  return results;
}

torch::Tensor cached_logits(CausalLMImpl& model, const std::vector<int64_t>& tokens, int64_t prefill_len) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  CA_CHECK(prefill_len >= 1 && prefill_len <= len, "prefill {} must be in [1, {}] (the number of tokens)",
           prefill_len, len);
  check_tokens(model.config(), tokens, "logits_with_cache");
  c10::InferenceMode inference;
  auto ids = to_device(tokens, model.device()).view({1, len});
  auto positions = torch::arange(len, ids.options()).view({1, len});
  KvCache cache = model.new_cache(1, prefill_len);
  std::vector<torch::Tensor> rows;
  auto hidden = model.forward(ids.narrow(1, 0, prefill_len), positions.narrow(1, 0, prefill_len), &cache);
  rows.push_back(model.logits(hidden[0]).to(torch::kFloat32));
  for (int64_t t = prefill_len; t < len; ++t) {
    hidden = model.forward(ids.narrow(1, t, 1), positions.narrow(1, t, 1), &cache);
    rows.push_back(model.logits(hidden[0]).to(torch::kFloat32));
  }
  return torch::cat(rows, 0).cpu();
}

}  // namespace cuda_agent::lm

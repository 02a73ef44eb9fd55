// Throughput and memory figures of the libtorch language model for docs/benchmarks.md
// (scripts/bench_lm.sh drives it through the ca-lm-bench tool). Timings synchronise the device
// around each measured call; memory is the caching allocator's peak of allocated bytes.
#include "torch_fmt.h"  // first: see there

#include <torch/cuda.h>
#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define CA_LM_HAVE_CUDA_ALLOCATOR 1
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "benchmark.h"
#include "torch_language_model.h"
#include "training.h"

namespace cuda_agent::lm {
namespace {

using nlohmann::json;

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Seconds of fn(), with the device idle before and after.
template <typename Fn>
double timed(const torch::Device& device, Fn&& fn) {
  synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  fn();
  synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <typename Fn>
double median_seconds(const torch::Device& device, int repeats, Fn&& fn) {
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) s.push_back(timed(device, fn));
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// The caching allocator's view of one CUDA device; null figures on the CPU.
class MemoryMeter {
 public:
  explicit MemoryMeter(const torch::Device& device) : device_(device) {}
  void reset_peak() {
#ifdef CA_LM_HAVE_CUDA_ALLOCATOR
    if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
#endif
  }
  json allocated() const { return stat(false); }
  json peak() const { return stat(true); }
  void release_cached() {
#ifdef CA_LM_HAVE_CUDA_ALLOCATOR
    if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }

 private:
  json stat(bool peak) const {
#ifdef CA_LM_HAVE_CUDA_ALLOCATOR
    if (device_.is_cuda()) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
      const auto& s = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      return peak ? s.peak : s.current;
    }
#endif
    return nullptr;
  }
  torch::Device device_;
};

std::vector<int64_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> out;
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab)));
  }
  return out;
}

int64_t positive(const json& spec, const char* key, int64_t fallback) {
  const int64_t v = spec.value(key, fallback);
  CA_CHECK(v > 0, "benchmark spec: '{}' must be a positive integer, not {}", key, v);
  return v;
}

std::vector<int64_t> positive_list(const json& spec, const char* key, std::vector<int64_t> fallback) {
  std::vector<int64_t> v = spec.value(key, fallback);
  CA_CHECK(!v.empty(), "benchmark spec: '{}' must list at least one size", key);
  for (int64_t x : v) CA_CHECK(x > 0, "benchmark spec: '{}' holds {}, which is not positive", key, x);
  return v;
}

// Prefill and decode throughput per batch size: generate() with one new token (prefill plus one
// sampling step) and with `new_tokens`, greedy, no stop tokens, medians of `repeats`.
json bench_generation(TorchLanguageModel& m, const json& spec) {
  const auto device = m.model()->device();
  const int64_t prompt = positive(spec, "prompt_tokens", 128), fresh = positive(spec, "new_tokens", 128);
  const int repeats = static_cast<int>(positive(spec, "repeats", 3));
  CA_CHECK(fresh >= 2, "benchmark spec: 'new_tokens' must be at least 2 (decode = all but the first)");
  json rows = json::array();
  for (int64_t batch : positive_list(spec, "batches", {1, 16, 64})) {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < batch; ++i) prompts.push_back(random_tokens(prompt, m.config().vocab_size, 100 + i));
    // Decoding from CUDA graphs (the default) and, beside it in the same run, without them.
    json row = {{"batch", batch}, {"prompt_tokens", prompt}, {"new_tokens", fresh}};
    for (const bool graphs : {true, false}) {
      lm::SamplingOptions one, all;
      one.greedy = all.greedy = true;
      one.max_new_tokens = 1;
      all.max_new_tokens = fresh;
      one.cuda_graphs = all.cuda_graphs = graphs;
      int64_t produced = 0;
      m.generate(prompts, all, {});  // warm-up: kernels, allocator, cache sizes
      const double t_prefill = median_seconds(device, repeats, [&] { m.generate(prompts, one, {}); });
      const double t_total = median_seconds(device, repeats, [&] {
        produced = 0;
        for (const auto& g : m.generate(prompts, all, {})) produced += static_cast<int64_t>(g.tokens.size());
      });
      CA_CHECK(produced == batch * fresh, "generation stopped early: {} of {} tokens", produced, batch * fresh);
      const double decode_s = std::max(t_total - t_prefill, 1e-9);
      json part = {{"prefill_seconds", t_prefill},
                   {"total_seconds", t_total},
                   {"prefill_tokens_per_s", static_cast<double>(batch * prompt) / t_prefill},
                   {"decode_tokens_per_s", static_cast<double>(batch * (fresh - 1)) / decode_s},
                   {"end_to_end_tokens_per_s", static_cast<double>(batch * fresh) / t_total}};
      if (graphs) row.update(part);
      else row["without_cuda_graphs"] = part;
    }
    rows.push_back(row);
  }
  return rows;
}

// Peak memory of one sequence's prefill (KV cache, activations, the first token's logits) per
// context length, above the weights.
json bench_inference_memory(TorchLanguageModel& m, const json& spec) {
  MemoryMeter meter(m.model()->device());
  json rows = json::array();
  lm::SamplingOptions one;
  one.greedy = true;
  one.max_new_tokens = 1;
  for (int64_t len : positive_list(spec, "contexts", {1024, 4096, 16384})) {
    meter.release_cached();
    const json base = meter.allocated();
    meter.reset_peak();
    m.generate({random_tokens(len, m.config().vocab_size, 7)}, one, {});
    const json peak = meter.peak();
    json row = {{"context", len}, {"peak_bytes", peak}};
    if (peak.is_number() && base.is_number()) row["peak_above_weights_bytes"] = peak.get<int64_t>() - base.get<int64_t>();
    rows.push_back(row);
  }
  return rows;
}

bool is_out_of_memory(const std::exception& e) {
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("OutOfMemory") != std::string::npos;
}

// One training step's forward and backward (log-probs, entropy, the value head where present)
// over a single sequence per context length, with or without checkpointing, until one does not
// fit: its time and peak memory above the weights.
json bench_training(TorchLanguageModel& m, const json& spec) {
  auto& model = m.model();
  const auto device = model->device();
  MemoryMeter meter(device);
  TokenStatsOptions options;
  options.checkpoint = spec.value("checkpoint", true);
  options.chunk_tokens = positive(spec, "chunk_tokens", options.chunk_tokens);
  model->train();
  json rows = json::array();
  for (int64_t len : positive_list(spec, "contexts", {8192, 16384, 32768})) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    meter.release_cached();
    const json base = meter.allocated();
    meter.reset_peak();
    json row = {{"context", len}, {"checkpoint", options.checkpoint}};
    try {
      const auto ids = torch::tensor(random_tokens(len, m.config().vocab_size, 11), torch::kInt64).to(device).view({1, len});
      row["seconds"] = timed(device, [&] {
        TokenStats s = token_stats(*model, ids, options);
        auto loss = s.logprobs.sum() + 0.01 * s.entropy.sum();
        if (s.values.defined()) loss = loss + s.values.sum();
        loss.backward();
      });
      row["fits"] = true;
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      row["fits"] = false;
    }
    const json peak = meter.peak();
    row["peak_bytes"] = peak;
    if (peak.is_number() && base.is_number()) row["peak_above_weights_bytes"] = peak.get<int64_t>() - base.get<int64_t>();
    rows.push_back(row);
    if (!row["fits"].get<bool>()) break;
  }
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->eval();
  return rows;
}

// Issue 19's rollout figure: `concurrent` threads, each one episode's turn (its own prompt and
// seed, sampled at temperature 1 without stop tokens, so every turn makes new_tokens), through
// the batched engine and through the per-call path (each thread decodes a batch of one; only up
// to `per_call_max` threads, since it is the slow one; 0: none), side by side on the same weights;
// aggregate new tokens per second of wall time. Each figure goes to stderr as it is measured.
json bench_rollout(TorchLanguageModel& plain, const json& spec) {
  const int64_t prompt = positive(spec, "prompt_tokens", 512), fresh = positive(spec, "new_tokens", 128);
  // per_call_max 0: the engine alone.
  const int64_t per_call_max = spec.value("per_call_max", int64_t{1} << 20);
  CA_CHECK(per_call_max >= 0, "benchmark spec: 'per_call_max' must be 0 (the engine alone) or more, not {}",
           per_call_max);
  lm::LmOptions with_engine = plain.options();
  with_engine.batch_engine = true;
  with_engine.kv_tokens = positive(spec, "kv_tokens", 262144);
  TorchLanguageModel engine(plain.model(), with_engine);
  // gathered_too: the engine once more with torch's attention over gathered keys instead of the
  // paged kernel (LmOptions::paged_attention), timed right after it on the same prompts (its own
  // pool: nothing of the first run is reused).
  std::unique_ptr<TorchLanguageModel> gathered;
  if (spec.value("gathered_too", false)) {
    with_engine.paged_attention = false;
    gathered = std::make_unique<TorchLanguageModel>(plain.model(), with_engine);
  }
  const torch::Device device = plain.model()->device();
  json rows = json::array();
  for (int64_t n : positive_list(spec, "concurrent", {1, 8, 32, 64, 128})) {
    // prompt_seed: every prompt differs from every other of the run (the warm-up's, the other
    // rows'), so that the engine's prefix cache cannot skip a timed prompt's prefill.
    auto run = [&](lm::LanguageModel& m, int64_t new_tokens, uint64_t prompt_seed) {
      std::vector<std::thread> threads;
      std::atomic<int64_t> produced{0};
      std::exception_ptr failed;
      std::mutex failed_mutex;
      const double seconds = timed(device, [&] {
        for (int64_t i = 0; i < n; ++i)
          threads.emplace_back([&, i] {
            lm::SamplingOptions o;
            o.max_new_tokens = new_tokens;
            o.seed = static_cast<uint64_t>(i);
            try {
              for (const auto& g : m.generate({random_tokens(prompt, m.config().vocab_size, prompt_seed + i)}, o, {}))
                produced += static_cast<int64_t>(g.tokens.size());
            } catch (...) {
              std::lock_guard<std::mutex> lock(failed_mutex);
              failed = std::current_exception();
            }
          });
        for (auto& t : threads) t.join();
      });
      if (failed) std::rethrow_exception(failed);
      return std::pair<double, double>(static_cast<double>(produced.load()) / seconds, seconds);
    };
    const uint64_t timed_seed = 100 + (static_cast<uint64_t>(n) << 20);
    run(engine, std::min<int64_t>(fresh, 8), timed_seed + (uint64_t{1} << 40));  // warm-up: kernels, the pool
    const lm::EngineStats before = engine.engine_stats();
    const auto [batched, batched_s] = run(engine, fresh, timed_seed);
    const lm::EngineStats after = engine.engine_stats();
    json row = {{"concurrent", n},
                {"prompt_tokens", prompt},
                {"new_tokens", fresh},
                {"engine_tokens_per_s", batched},
                {"engine_seconds", batched_s},
                {"engine_steps", after.steps - before.steps},
                {"engine_paged_steps", after.paged_steps - before.paged_steps},
                {"engine_step_seconds", after.step_seconds - before.step_seconds},
                {"engine_device_wait_seconds", after.device_wait_seconds - before.device_wait_seconds},
                {"engine_peak_rows", after.peak_rows},
                {"engine_prefilled_tokens", after.prefilled_tokens - before.prefilled_tokens},
                {"engine_reused_tokens", after.reused_tokens - before.reused_tokens},
                {"engine_preemptions", after.preemptions - before.preemptions}};
    if (gathered) {
      run(*gathered, std::min<int64_t>(fresh, 8), timed_seed + (uint64_t{1} << 40));
      const auto [tokens_per_s, seconds] = run(*gathered, fresh, timed_seed);
      row["gathered_tokens_per_s"] = tokens_per_s;
      row["gathered_seconds"] = seconds;
    }
    std::fprintf(stderr, "[rollout] %s\n", row.dump().c_str());
    if (n <= per_call_max) {
      const auto [alone, alone_s] = run(plain, fresh, timed_seed);
      row["per_call_tokens_per_s"] = alone;
      row["per_call_seconds"] = alone_s;
      row["engine_over_per_call"] = batched / alone;
      std::fprintf(stderr, "[rollout] concurrent %lld: per call %.0f tokens/s (%.1f s)\n", static_cast<long long>(n),
                   alone, alone_s);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

json run_benchmark(const json& spec) {
  CA_CHECK(spec.is_object(), "benchmark spec must be a JSON object");
  lm::LmOptions options;
  options.device = spec.value("device", "cuda");
  options.dtype = spec.value("dtype", "bfloat16");
  options.seed = spec.value("seed", 1);
  options.value_head = spec.value("value_head", false);
  std::unique_ptr<TorchLanguageModel> m;
  if (spec.contains("model")) {
    m = TorchLanguageModel::load(spec["model"].get<std::string>(), options);
  } else {
    CA_CHECK(spec.contains("config"), "benchmark spec: give 'model' (a path) or 'config' (a config.json object)");
    m = TorchLanguageModel::random(policy::ModelConfig::from_hf_json(spec["config"], "benchmark spec 'config'"), options);
  }
  int64_t parameters = 0;
  for (const auto& p : m->model()->parameters()) parameters += p.numel();
  json out = {{"device", options.device}, {"dtype", options.dtype}, {"parameters", parameters},
              {"torch", TORCH_VERSION}, {"config", m->config().to_hf_json()}};
  if (spec.contains("save_hf")) m->save_hf(spec["save_hf"].get<std::string>());
  if (spec.contains("generation")) out["generation"] = bench_generation(*m, spec["generation"]);
  if (spec.contains("inference_memory")) out["inference_memory"] = bench_inference_memory(*m, spec["inference_memory"]);
  if (spec.contains("training")) out["training"] = bench_training(*m, spec["training"]);
  if (spec.contains("rollout")) out["rollout"] = bench_rollout(*m, spec["rollout"]);
  return out;
}

}  // namespace cuda_agent::lm

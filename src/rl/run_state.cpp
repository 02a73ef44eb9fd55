#include "cuda_agent/rl/run_state.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <system_error>

#include "cuda_agent/bench/svg_plot.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/policy/tokenizer.h"
#include "cuda_agent/policy/weights.h"

namespace fs = std::filesystem;

namespace cuda_agent::rl {
namespace {

constexpr const char* kCheckpoints = "checkpoints";
constexpr const char* kLatest = "latest";
constexpr const char* kState = "state.json";

std::string step_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// The step of a folder named step-NNNNNN, or -1.
int64_t parse_step_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// splitmix64: a small generator whose output is the same on every platform (std::shuffle's is not).
uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
  } else {
    out[prefix] = j;
  }
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

}  // namespace

// ---- metrics ------------------------------------------------------------------------------------

MetricsLog::MetricsLog(fs::path path) : path_(std::move(path)) {
  if (path_.has_parent_path()) fs::create_directories(path_.parent_path());
}

void MetricsLog::append(const nlohmann::json& record) {
  CA_CHECK(record.is_object(), "a metrics record must be a JSON object, not {}", record.dump());
  std::ofstream out(path_, std::ios::app);
  CA_CHECK(out.good(), "cannot open the metrics file {} for appending", path_.string());
  out << record.dump() << '\n';
  out.flush();
  CA_CHECK(out.good(), "cannot write to the metrics file {} (disk full?)", path_.string());
}

std::vector<nlohmann::json> MetricsLog::read(const fs::path& path) {
  std::vector<nlohmann::json> records;
  if (!fs::exists(path)) return records;
  const std::string text = read_file(path);
  size_t start = 0, line = 1;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) break;  // an unterminated last line: a write cut short
    const std::string row = text.substr(start, end - start);
    if (!row.empty()) {
      try {
        records.push_back(nlohmann::json::parse(row));
      } catch (const nlohmann::json::exception& e) {
        CA_FAIL("{}:{}: not a JSON record ({}); fix or delete that line", path.string(), line, e.what());
      }
      CA_CHECK(records.back().is_object(), "{}:{}: a metrics record must be a JSON object", path.string(), line);
    }
    start = end + 1;
    ++line;
  }
  return records;
}

void MetricsLog::truncate_after(const fs::path& path, int64_t step) {
  std::string kept;
  for (const auto& r : read(path))
    if (r.value("step", int64_t{0}) <= step) kept += r.dump() + "\n";
  write_file_atomic(path, kept);
}

std::vector<fs::path> write_training_plots(const std::vector<nlohmann::json>& records, const fs::path& dir) {
  struct Series {
    const char* key;    // the metrics.jsonl field
    const char* label;  // the legend's words
  };
  struct Chart {
    const char* file;
    const char* title;
    const char* y_label;
    std::vector<Series> series;
    bool fraction;  // a 0-100% axis; otherwise fitted to the data (clip shares are a few percent)
  };
  const std::vector<Chart> charts = {
      {"reward.svg", "Reward per step (mean over episodes)", "reward", {{"reward_mean", "mean reward"}}, false},
      {"rates.svg", "Pass and faster-than-torch.compile rates", "share of episodes",
       {{"pass_rate", "correct"}, {"faster_than_compile_rate", "correct and faster than torch.compile"}}, true},
      {"kl.svg", "KL to the reference policy", "KL", {{"kl", "KL (per token)"}}, false},
      {"entropy.svg", "Policy entropy per token", "nats", {{"entropy", "entropy"}}, false},
      {"losses.svg", "Losses", "loss", {{"policy_loss", "policy loss"}, {"value_loss", "value loss"}}, false},
      {"clip_fraction.svg", "Clipped share of policy tokens", "share of tokens", {{"clip_fraction", "clipped share"}},
       false},
      {"response_length.svg", "Response length (tokens per episode)", "tokens",
       {{"response_length_mean", "mean tokens"}}, false},
  };
  std::vector<fs::path> written;
  for (const Chart& chart : charts) {
    std::vector<bench::Curve> curves;
    for (const Series& series : chart.series) {
      bench::Curve c{series.label, {}};
      for (const auto& r : records)
        if (r.contains(series.key) && r[series.key].is_number() && r.contains("step") && r["step"].is_number())
          c.points.emplace_back(r["step"].get<double>(), r[series.key].get<double>());
      if (!c.points.empty()) curves.push_back(std::move(c));
    }
    if (curves.empty()) continue;
    fs::create_directories(dir);
    const fs::path file = dir / chart.file;
    write_file_atomic(file, chart.fraction ? bench::fraction_curves_svg(curves, chart.title, "step", chart.y_label)
                                           : bench::line_chart_svg(curves, chart.title, "step", chart.y_label));
    written.push_back(file);
  }
  return written;
}

// ---- task cursor --------------------------------------------------------------------------------

TaskCursor::TaskCursor(size_t tasks, uint64_t seed) : tasks_(tasks), seed_(seed) {
  CA_CHECK(tasks > 0, "a task cursor needs at least one task");
  shuffle();
}

void TaskCursor::shuffle() {
  order_.resize(tasks_);
  for (size_t i = 0; i < tasks_; ++i) order_[i] = i;
  uint64_t state = seed_ ^ (0xD1B54A32D192ED03ULL * (epoch_ + 1));
  for (size_t i = tasks_; i > 1; --i) std::swap(order_[i - 1], order_[splitmix(state) % i]);  // Fisher-Yates
}

std::vector<size_t> TaskCursor::next(size_t count) {
  std::vector<size_t> out;
  out.reserve(count);
  while (out.size() < count) {
    if (position_ == tasks_) {
      ++epoch_;
      position_ = 0;
      shuffle();
    }
    out.push_back(order_[position_++]);
  }
  return out;
}

nlohmann::json TaskCursor::state() const {
  return {{"tasks", tasks_}, {"seed", seed_}, {"epoch", epoch_}, {"position", position_}};
}

void TaskCursor::restore(const nlohmann::json& state) {
  try {
    const auto tasks = state.at("tasks").get<size_t>();
    CA_CHECK(tasks == tasks_, "the checkpoint's task cursor covers {} tasks but the split now has {}; resume with "
             "the same split",
             tasks, tasks_);
    seed_ = state.at("seed").get<uint64_t>();
    epoch_ = state.at("epoch").get<uint64_t>();
    position_ = state.at("position").get<size_t>();
    CA_CHECK(position_ <= tasks_, "the checkpoint's task cursor is at {} of {} tasks", position_, tasks_);
  } catch (const nlohmann::json::exception& e) {
    CA_FAIL("malformed task cursor state {}: {}", state.dump(), e.what());
  }
  shuffle();
}

// ---- checkpoints --------------------------------------------------------------------------------

CheckpointInfo write_checkpoint(const fs::path& run_dir, int64_t step, const nlohmann::json& state,
                                const std::function<void(const fs::path&)>& write_payload, int keep_last) {
  CA_CHECK(step >= 0, "checkpoint step {} is negative", step);
  CA_CHECK(state.is_object(), "checkpoint state must be a JSON object");
  const fs::path root = run_dir / kCheckpoints;
  fs::create_directories(root);
  const fs::path final_dir = root / step_name(step);
  const fs::path tmp = root / fmt::format(".{}.tmp-{}", step_name(step), ::getpid());
  remove_quietly(tmp);
  try {
    fs::create_directories(tmp);
    if (write_payload) write_payload(tmp);
    nlohmann::json full = state;
    full["step"] = step;
    write_file_atomic(tmp / kState, full.dump(2));
    // The same step again (a resumed run re-saving it): move the old one aside first, because a
    // rename cannot replace a non-empty folder.
    const fs::path old = root / fmt::format(".{}.old-{}", step_name(step), ::getpid());
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    remove_quietly(old);
    write_file_atomic(root / kLatest, step_name(step) + "\n");
  } catch (const Error&) {
    remove_quietly(tmp);
    throw;
  } catch (const std::exception& e) {
    remove_quietly(tmp);
    CA_FAIL("cannot write the checkpoint {}: {}", final_dir.string(), e.what());
  }
  if (keep_last > 0) {
    std::vector<std::pair<int64_t, fs::path>> all;
    for (const auto& entry : fs::directory_iterator(root)) {
      const int64_t s = parse_step_name(entry.path().filename().string());
      if (s >= 0 && entry.is_directory()) all.emplace_back(s, entry.path());
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i)
      if (all[i].second != final_dir) remove_quietly(all[i].second);
  }
  CheckpointInfo info;
  info.dir = final_dir;
  info.step = step;
  info.state = state;
  info.state["step"] = step;
  return info;
}

namespace {

// state.json of the checkpoint folder `dir` into `info` (dir, state, step); `name` is the folder's
// name, the step when state.json has none.
void read_checkpoint_state(const fs::path& dir, CheckpointInfo& info) {
  info.dir = dir;
  const fs::path state = dir / kState;
  try {
    info.state = nlohmann::json::parse(read_file(state));
  } catch (const nlohmann::json::exception& e) {
    CA_FAIL("{} is not valid JSON: {}", state.string(), e.what());
  }
  CA_CHECK(info.state.is_object(), "{} holds {}, not a JSON object", state.string(), info.state.dump());
  info.step = info.state.value("step", parse_step_name(dir.filename().string()));
}

}  // namespace

CheckpointInfo latest_checkpoint(const fs::path& run_dir) {
  CheckpointInfo info;
  info.step = -1;
  const fs::path pointer = run_dir / kCheckpoints / kLatest;
  if (!fs::exists(pointer)) return info;
  std::string name = read_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  CA_CHECK(parse_step_name(name) >= 0, "{} names '{}', not a checkpoint folder (step-NNNNNN)", pointer.string(), name);
  const fs::path dir = run_dir / kCheckpoints / name;
  CA_CHECK(fs::exists(dir / kState), "{} names {}, which has no {}; the checkpoint is incomplete: point `latest` at an "
           "earlier step-* folder or start a new run",
           pointer.string(), dir.string(), kState);
  read_checkpoint_state(dir, info);
  return info;
}

CheckpointInfo find_checkpoint(const fs::path& path) {
  CA_CHECK(fs::is_directory(path), "checkpoint '{}': no such folder; pass a run folder (run.output_dir) or one of its "
           "checkpoints/step-NNNNNN folders", path.string());
  CheckpointInfo info;
  if (fs::exists(path / kState)) {
    read_checkpoint_state(path, info);
    return info;
  }
  info = latest_checkpoint(path);
  CA_CHECK(info.step >= 0, "checkpoint '{}': neither a checkpoint folder (no {}) nor a run folder with a checkpoint "
           "(no {}/{}); pass run.output_dir of a training run that wrote one, or a checkpoints/step-NNNNNN folder",
           path.string(), kState, kCheckpoints, kLatest);
  return info;
}

void write_actor_tokenizer_files(const fs::path& actor, const fs::path& to) {
  if (!fs::is_directory(actor)) {
    policy::Tokenizer::from_gguf_metadata(policy::open_gguf(actor)->metadata(), actor.string()).save_hf(to);
    return;
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                           "vocab.json", "merges.txt", "chat_template.jinja"}) {
    if (fs::is_regular_file(actor / name)) fs::copy_file(actor / name, to / name, fs::copy_options::overwrite_existing);
  }
}

std::string checkpoint_policy_spec(const fs::path& path, const std::string& device, const std::string& overrides) {
  const CheckpointInfo ckpt = find_checkpoint(path);
  const fs::path actor = ckpt.dir / "actor";
  CA_CHECK(fs::is_directory(actor), "checkpoint {} has no actor/ folder (the policy's weights); it is not a "
           "checkpoint of `cuda-agent train`", ckpt.dir.string());
  const nlohmann::json config = ckpt.state.value("config", nlohmann::json::object());
  auto get = [&](const char* section, const char* key, const nlohmann::json& fallback) {
    const nlohmann::json s = config.value(section, nlohmann::json::object());
    return s.is_object() ? s.value(key, fallback) : fallback;
  };
  // The actor as the run's rollouts sampled it; float16 runs load as bfloat16 (the local policy's
  // reduced precision).
  const std::string dtype = get("model", "dtype", "float32").get<std::string>() == "float32" ? "float32" : "bfloat16";
  std::string spec = fmt::format("local:{}?temperature={}&top_p={}&max_new_tokens={}&dtype={}&device={}",
                                 actor.string(), get("rollout", "temperature", 1.0).dump(),
                                 get("rollout", "top_p", 1.0).dump(), get("rollout", "max_new_tokens", 2048).dump(),
                                 dtype, device);
  // Decoded as the rollouts were: through one batch engine for the episodes side by side (the
  // same samples, lm::LmOptions::batch_engine; overrides may say batch_engine=0).
  if (get("rollout", "batch_engine", false) == true) spec += "&batch_engine=1";
  if (!overrides.empty()) spec += "&" + overrides;
  return spec;
}

const std::vector<std::string> kResumeMayChange = {"run.output_dir",
                                                   "ppo.steps",
                                                   "stages.warmup.steps",
                                                   "stages.value_pretrain.steps",
                                                   "stages.warmup.enabled",
                                                   "stages.rft.enabled",
                                                   "stages.value_pretrain.enabled",
                                                   "ppo.enabled",
                                                   "stages.sft.enabled",
                                                   "rollout.concurrent_episodes"};

std::vector<std::string> resume_may_change(const nlohmann::json& saved_config, const std::string& stage) {
  std::vector<std::string> keys = kResumeMayChange;
  const nlohmann::json sft = saved_config.value("stages", nlohmann::json::object()).value("sft", nlohmann::json::object());
  const nlohmann::json threshold = sft.value("keep_reward_above", nlohmann::json(0.0));
  if (stage == "sft" && threshold.is_number() && threshold.get<double>() <= 0.0) keys.push_back("reward");
  return keys;
}

std::vector<std::string> config_differences(const nlohmann::json& saved, const nlohmann::json& now,
                                            const std::vector<std::string>& may_change) {
  std::map<std::string, nlohmann::json> a, b;
  flatten(saved, "", a);
  flatten(now, "", b);
  auto allowed = [&](const std::string& key) {
    return std::any_of(may_change.begin(), may_change.end(), [&](const std::string& m) {
      return key == m || key.rfind(m + ".", 0) == 0;
    });
  };
  std::vector<std::string> out;
  for (const auto& [key, value] : a) {
    if (allowed(key)) continue;
    auto it = b.find(key);
    if (it == b.end()) out.push_back(fmt::format("{}: {} -> (missing)", key, value.dump()));
    else if (it->second != value) out.push_back(fmt::format("{}: {} -> {}", key, value.dump(), it->second.dump()));
  }
  for (const auto& [key, value] : b)
    if (!allowed(key) && !a.count(key)) out.push_back(fmt::format("{}: (missing) -> {}", key, value.dump()));
  return out;
}

}  // namespace cuda_agent::rl

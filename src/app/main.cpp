// cuda-agent: the command-line verbs. Verbs parse options and call the components; no logic.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cuda_agent/agent/episode.h"
#include "cuda_agent/agent/eval_runner.h"
#include "cuda_agent/agent/policy.h"
#include "cuda_agent/bench/bench_runner.h"
#include "cuda_agent/bench/compare.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/bench/synth.h"
#include "cuda_agent/core/config.h"
#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/progress.h"
#include "cuda_agent/core/stop_request.h"
#include "cuda_agent/policy/chat_session.h"
#include "cuda_agent/policy/local_policy.h"
#include "cuda_agent/policy/openai_server.h"
#include "cuda_agent/rl/ablation.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/rl/trainer.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/doctor.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"

namespace fs = std::filesystem;
using namespace cuda_agent;

namespace {

// Exit codes: 0 done; 1 the solution failed (verify/profile/evaluate/compile) or doctor found
// something missing; 2 bad input (command-line syntax included) or a machine that cannot do the
// job. bench exits 0 whenever it produced a report.
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

struct CommonFlags {
  std::string config;
  std::vector<std::string> sets;
  std::string log_level = "warn";
};

void add_common(CLI::App* cmd, CommonFlags& f) {
  cmd->add_option("--config", f.config, "YAML file whose 'sandbox:' section sets evaluation options");
  cmd->add_option("--set", f.sets, "override one option, e.g. --set sandbox.timed_runs=50 (repeatable)");
  cmd->add_option("--log-level", f.log_level, "trace, debug, info, warn, error or off");
}

sandbox::SandboxOptions resolve_options(const CommonFlags& f, nlohmann::json* resolved = nullptr) {
  set_log_level(f.log_level);
  nlohmann::json config = {{"sandbox", sandbox::SandboxOptions::defaults()}};
  std::set<std::string> pinned;
  if (!f.config.empty()) {
    const nlohmann::json file = load_yaml_file(f.config);
    if (file.is_object() && file.contains("sandbox") && file["sandbox"].is_object())
      for (const auto& [key, _] : file["sandbox"].items()) pinned.insert(key);
    merge_checked(config, file, f.config);
  }
  for (const auto& s : f.sets) {
    apply_override(config, s);
    if (s.rfind("sandbox.", 0) == 0) pinned.insert(s.substr(8, s.find('=') - 8));
  }
  if (resolved) *resolved = config;
  sandbox::SandboxOptions options = sandbox::SandboxOptions::from_json(config["sandbox"]);
  options.pinned = std::move(pinned);
  return options;
}

void require_gpu(const char* verb) {
  std::string why;
  if (!sandbox::gpu_available(&why)) {
    throw Error(fmt::format("cuda-agent {} needs an NVIDIA GPU, and this machine has none usable: {}\n"
                            "Run `cuda-agent doctor` to see what is missing. CPU-only machines can still run "
                            "`cuda-agent verify --device cpu` and `cuda-agent compile`.",
                            verb, why));
  }
}

void print_result(const nlohmann::json& r) {
  std::cout << fmt::format("task      {}\nsolution  {}\n", r.value("task_path", ""), r.value("solution_path", ""));
  if (r.value("ok", false)) {
    std::cout << "result    pass";
    if (r.contains("verify")) std::cout << fmt::format(" ({} trials within atol={} rtol={})", r["verify"]["trials"].size(),
                                                      r["verify"]["atol"].dump(), r["verify"]["rtol"].dump());
    std::cout << "\n";
  } else {
    std::cout << fmt::format("result    FAIL [{}]\n{}\n", r["category"].is_string() ? r["category"].get<std::string>() : "?",
                             r.value("message", ""));
    if (r.contains("log") && !r["log"].get<std::string>().empty())
      std::cout << "worker log (tail):\n" << r["log"].get<std::string>() << "\n";
  }
  if (r.contains("timings")) {
    const auto& t = r["timings"];
    auto ms = [](const nlohmann::json& j) {
      return j.is_object() ? fmt::format("{:.4f} ms (p10 {:.4f}, p90 {:.4f}, {} runs)", j["median_ms"].get<double>(),
                                         j["p10_ms"].get<double>(), j["p90_ms"].get<double>(), j["runs"].get<int>())
                           : std::string("-");
    };
    std::cout << fmt::format("eager     {}{}\ncompile   {}\ncandidate {}\n", ms(t["eager"]),
                             t.value("baselines_cached", false) ? " [cached baseline]" : "", ms(t["compile"]),
                             ms(t["candidate"]));
    if (r["speedup_vs_eager"].is_number())
      std::cout << fmt::format("speedup   {:.3f}x vs eager, {}\n", r["speedup_vs_eager"].get<double>(),
                               r["speedup_vs_compile"].is_number()
                                   ? fmt::format("{:.3f}x vs torch.compile", r["speedup_vs_compile"].get<double>())
                                   : "torch.compile not timed");
    if (r.contains("kernels")) {
      std::cout << "kernels   (candidate, per forward)\n";
      for (const auto& k : r["kernels"]["candidate"])
        std::cout << fmt::format("  {:>8.2f} us x{:<4g} stream(s) {}  {}\n", k["mean_us"].get<double>(),
                                 k["calls_per_forward"].get<double>(), k["streams"].dump(), k["name"].get<std::string>());
    }
  }
  if (r.value("mode", "") == "evaluate") std::cout << fmt::format("reward    {:g} ({})\n", r.value("reward", -1.0), r.value("reward_kind", ""));
}

// The file an option names: the path itself, or a folder's `conventional` file (a task folder's
// model.py, a solution folder's model_new.py), as bench reads split folders. Anything else is a
// usage error that says what the path is.
fs::path python_file_argument(const char* option, const std::string& path, const char* conventional) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_regular_file(st)) return path;
  CA_CHECK(fs::exists(st), "{} {}: no such file", option, path);
  CA_CHECK(fs::is_directory(st), "{} {}: not a regular file", option, path);
  const fs::path inside = fs::path(path) / conventional;
  CA_CHECK(fs::is_regular_file(inside), "{} {}: is a folder without a {}; give the Python file itself", option, path,
           conventional);
  return inside;
}

int run_single(const std::string& mode, const std::string& task, const std::string& solution, const std::string& device,
               int gpu, bool gpu_lock, const std::string& output, bool json, const CommonFlags& flags) {
  sandbox::EvalRequest req;
  req.gpu_lock = gpu_lock;
  req.options = resolve_options(flags);
  req.mode = sandbox::eval_mode_from_string(mode);
  req.task_path = fs::absolute(python_file_argument("--task", task, "model.py")).string();
  req.solution_path = fs::absolute(python_file_argument("--solution", solution, "model_new.py")).string();
  req.task_id = fs::path(req.task_path).parent_path().filename().string();
  req.device = device;
  req.gpu = gpu;
  CA_CHECK(device == "cuda" || device == "cpu", "--device must be cuda or cpu, got '{}'", device);
  // The task's own tolerance and precision (task.yaml beside model.py) unless the run pins them.
  bench::apply_task_options(req.options, fs::path(req.task_path));
  if (device == "cuda") require_gpu(mode.c_str());
  CA_CHECK(device == "cuda" || mode == "verify", "{} needs a GPU; only verify runs with --device cpu", mode);
  nlohmann::json result = sandbox::evaluate(req).to_json();
  if (!output.empty()) write_file_atomic(output, result.dump(2));
  if (json) std::cout << result.dump(2) << "\n";
  else print_result(result);
  return result.value("ok", false) ? 0 : kExitFailed;
}

std::vector<int> parse_gpus(const std::string& text) {
  std::vector<int> gpus;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      size_t used = 0;
      int g = std::stoi(item, &used);
      CA_CHECK(used == item.size() && g >= 0, "");
      gpus.push_back(g);
    } catch (...) {
      CA_FAIL("--gpus '{}': expected a comma-separated list of GPU indices, e.g. 0,1", text);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return gpus;
}

struct GenerateFlags {
  std::string model, prompt, chat, messages, system, device = "cpu", dtype = "float32";
  int64_t max_tokens = 256, top_k = 0;
  double temperature = 0.7, top_p = 1.0;
  uint64_t seed = 0;
  bool raw = false;
};

// `generate`: one reply streamed to stdout; timing to stderr.
int run_generate(const GenerateFlags& g) {
  int given = !g.prompt.empty() + !g.chat.empty() + !g.messages.empty();
  CA_CHECK(given == 1, "generate needs exactly one of --prompt TEXT, --chat TEXT or --messages FILE.json");
  policy::LmOptions lm;
  lm.device = g.device;
  lm.dtype = g.dtype;
  const auto t_load = std::chrono::steady_clock::now();
  auto session = policy::ChatSession::open(g.model, lm);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  policy::ChatRequestOptions opts;
  opts.sampling.temperature = g.temperature;
  opts.sampling.top_p = g.top_p;
  opts.sampling.top_k = g.top_k;
  opts.sampling.max_new_tokens = g.max_tokens;
  opts.sampling.seed = g.seed;
  auto print = [](const std::string& delta) {
    std::cout << delta << std::flush;
    return true;
  };
  policy::ChatReply reply;
  if (!g.prompt.empty() || g.raw) {
    reply = session->complete(g.prompt.empty() ? g.chat : g.prompt, opts, print);
  } else {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array(), tools = nlohmann::ordered_json::array();
    if (!g.messages.empty()) {
      auto j = nlohmann::ordered_json::parse(read_file(g.messages), nullptr, false);
      CA_CHECK(!j.is_discarded(), "--messages {}: not valid JSON", g.messages);
      if (j.is_object()) {
        tools = j.value("tools", nlohmann::ordered_json::array());
        j = j.value("messages", nlohmann::ordered_json());
      }
      CA_CHECK(j.is_array(), "--messages {}: expected an array of chat messages or {{\"messages\": [...], \"tools\": [...]}}",
               g.messages);
      messages = j;
    } else {
      messages.push_back({{"role", "user"}, {"content", g.chat}});
    }
    if (!g.system.empty())
      messages.insert(messages.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", g.system}});
    reply = session->chat(messages, tools, opts, print);
  }
  std::cout << "\n" << std::flush;
  for (const auto& c : reply.tool_calls) std::cerr << fmt::format("tool call: {} {}\n", c.name, c.arguments.dump());
  std::cerr << fmt::format("[model loaded in {:.2f} s; prompt {} tokens; {} tokens in {:.2f} s, {:.1f} tokens/s; finish: {}]\n",
                           load_s, reply.prompt_tokens, reply.completion_tokens, reply.seconds,
                           reply.seconds > 0 ? reply.completion_tokens / reply.seconds : 0.0, reply.finish_reason);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  policy::register_local_policy();  // --policy local:MODEL (make_policy lives in ca_agent, below ca_serve)
  CLI::App app{"cuda-agent: train and evaluate language models that write fast CUDA kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cuda-agent 0.1.0");

  CommonFlags flags;
  std::string task, solution, device = "cuda", output;
  int gpu = 0;
  bool json = false, gpu_lock = false;
  std::vector<std::pair<std::string, CLI::App*>> single;
  for (const char* verb : {"verify", "profile", "evaluate"}) {
    const char* help = std::string(verb) == "verify"    ? "check a solution against its task on five seeded random inputs"
                       : std::string(verb) == "profile" ? "time eager, torch.compile and the solution"
                                                        : "verify, then profile, then score the solution (reward -1/1/2/3)";
    CLI::App* cmd = app.add_subcommand(verb, help);
    cmd->add_option("--task", task, "the task's model.py (KernelBench format), or its folder")->required();
    cmd->add_option("--solution", solution, "the solution's model_new.py, or its folder")->required();
    cmd->add_option("--device", device,
                    std::string(verb) == "verify" ? "cuda (default), or cpu: no GPU, the checks only"
                                                  : "cuda (the default and the only choice: timing needs a GPU)");
    cmd->add_option("--gpu", gpu, "GPU index to pin the worker to");
    cmd->add_option("--output", output, "write the result JSON here");
    cmd->add_flag("--json", json, "print the result JSON instead of the summary");
    cmd->add_flag("--gpu-lock", gpu_lock,
                  "take the GPU's lock files: GPU work and timed runs one at a time with other locked runs");
    add_common(cmd, flags);
    single.emplace_back(verb, cmd);
  }

  CLI::App* bench = app.add_subcommand("bench", "score the solutions of a split and print the result table");
  std::string split, solutions, gpus = "0", bench_out;
  bool no_resume = false;
  int workers_per_gpu = 2;
  const char* workers_help = "worker processes in flight per GPU: 2 starts the next worker's Python while the current "
                             "one runs (GPU phases and timed runs stay one at a time; 1 runs one evaluation at a time; docs/benchmarks.md, section 5)";
  bench->add_option("--split", split, "split: a folder with split.yaml, a KernelBench folder (level1/...), or rows (.jsonl/.parquet)");
  bench->add_option("--solutions", solutions, "folder of solutions: <id>/model_new.py or <id>.py");
  bench->add_option("--gpus", gpus, "comma-separated GPU indices to spread evaluations over");
  bench->add_option("--output", bench_out, "run folder (default runs/bench-<split>)");
  bench->add_flag("--no-resume", no_resume, "re-evaluate tasks that already have a result");
  bench->add_option("--workers-per-gpu", workers_per_gpu, workers_help)->check(CLI::Range(1, 16));
  add_common(bench, flags);
  CLI::App* compare = bench->add_subcommand("compare", "show two bench runs side by side, per task and per level");
  std::string run_a, run_b;
  compare->add_option("run_a", run_a, "the first run folder (holding results/)")->required();
  compare->add_option("run_b", run_b, "the second run folder")->required();
  compare->add_flag("--json", json, "print the comparison as JSON");

  CLI::App* baselines = app.add_subcommand(
      "baselines", "time eager and torch.compile for every task of a split into the shared baseline cache");
  baselines->add_option("--split", split, "split folder (with split.yaml)")->required();
  baselines->add_option("--gpus", gpus, "comma-separated GPU indices to spread tasks over");
  baselines->add_option("--output", bench_out, "run folder (default runs/baselines-<split>)");
  baselines->add_option("--workers-per-gpu", workers_per_gpu, workers_help)->check(CLI::Range(1, 16));
  add_common(baselines, flags);

  CLI::App* solve = app.add_subcommand("solve", "one agent episode on a task, transcript streamed, trajectory saved");
  std::string policy_spec, skill_file = std::string(CUDA_AGENT_SKILLS_DIR) + "/cuda-kernel-sandbox/SKILL.md";
  int max_turns = 150;
  bool single_turn = false;
  solve->add_option("--task", task, "the task's model.py")->required();
  solve->add_option("--policy", policy_spec,
                    "replay:FILE.jsonl (scripted tool calls), openai:MODEL@BASE_URL or local:MODEL[?temperature=T&...] "
                    "(the in-process model; docs/agent.md)")
      ->required();
  solve->add_option("--output", output, "episode folder (default runs/solve-<task>-<time>)");
  solve->add_option("--skill", skill_file, "SKILL.md loaded into the system prompt");
  solve->add_option("--max-turns", max_turns, "most policy replies (default 150)");
  solve->add_flag("--single-turn", single_turn, "no tools: one answer holding model_new.py (the no-agent-loop ablation)");
  solve->add_option("--device", device, "cuda (default) or cpu (verify-only scoring)");
  solve->add_option("--gpu", gpu, "GPU index for the episode's checks");
  add_common(solve, flags);

  CLI::App* eval = app.add_subcommand("eval", "agent episodes over a split, scored, with the bench report");
  eval->add_option("--split", split, "split: own folder, KernelBench folder, or rows (.jsonl/.parquet)")->required();
  std::string eval_checkpoint;
  CLI::Option* eval_policy = eval->add_option("--policy", policy_spec,
                                              "replay:FILE.jsonl, openai:MODEL@BASE_URL or local:MODEL[?key=value&...]");
  eval->add_option("--checkpoint", eval_checkpoint,
                   "a training run folder (its latest checkpoint) or a checkpoints/step-N folder, optionally "
                   "?key=value&... as local: takes (e.g. ?temperature=0): its actor is the policy")
      ->excludes(eval_policy);
  eval->add_option("--gpus", gpus, "comma-separated GPU indices to spread episodes over");
  eval->add_option("--output", bench_out, "run folder (default runs/eval-<split>-<time>)");
  eval->add_option("--skill", skill_file, "SKILL.md loaded into the system prompt");
  eval->add_option("--max-turns", max_turns, "most policy replies per episode (the paper evaluates with 200)");
  eval->add_flag("--single-turn", single_turn, "no tools: one answer per task (the no-agent-loop ablation)");
  eval->add_option("--device", device, "cuda (default) or cpu (verify-only scoring)");
  add_common(eval, flags);

  CLI::App* synth = app.add_subcommand(
      "synth",
      "make training tasks: compose catalogue ops into KernelBench-format models and keep those that pass "
      "the filters (docs/synth.md)");
  bench::SynthOptions synth_opts;
  std::string synth_composer = "sampler", synth_prompt = std::string(CUDA_AGENT_DATA_DIR) + "/synth/compose_prompt.md",
              synth_catalogue = std::string(CUDA_AGENT_DATA_DIR) + "/synth/catalogue.json", synth_refresh, synth_from,
              synth_kb;
  std::vector<double> synth_window = {1, 100};
  synth->add_option("--output", output, "the split folder to write (split.yaml, tasks/, funnel.md, work/)");
  synth->add_option("--count", synth_opts.count, "candidates to compose (default 300)")->check(CLI::Range(1, 1000000));
  synth->add_option("--seed", synth_opts.seed, "seed of the composition (default 0)");
  synth->add_option("--max-ops", synth_opts.max_ops, "ops per model, at most (1-5, default 5)")
      ->check(CLI::Range(1, 5));
  synth->add_option(
      "--composer", synth_composer,
      "sampler (the built-in typed sampler, the default) or a policy spec: openai:MODEL@URL, local:MODEL, "
      "replay:FILE.jsonl");
  synth->add_option("--prompt", synth_prompt, "the LLM composer's prompt template ({ops}, {max_ops} filled in)");
  synth->add_option("--catalogue", synth_catalogue, "the op catalogue (default data/synth/catalogue.json)");
  synth->add_option("--refresh-catalogue", synth_refresh, "crawl the op catalogue into this file and stop");
  synth->add_option("--from-split", synth_from,
                    "filter this split's tasks instead of composing: a split folder or Ops-6K rows (.jsonl/.parquet)");
  synth->add_option("--kernelbench", synth_kb,
                    "a KernelBench folder (level1/ ...): drop tasks too similar to its tasks");
  synth->add_option("--eager-window", synth_window, "eager time window in ms, MIN MAX (default 1 100)")->expected(2);
  synth->add_option("--max-similarity", synth_opts.max_similarity,
                    "AST similarity above this drops a task (default 0.9)");
  synth->add_option("--device", device, "cuda (default: every filter) or cpu (no torch.compile or timing filter)");
  synth->add_option("--gpus", gpus, "comma-separated GPU indices to spread evaluations over");
  synth->add_option("--workers-per-gpu", workers_per_gpu, workers_help)->check(CLI::Range(1, 16));
  add_common(synth, flags);

  CLI::App* train = app.add_subcommand(
      "train", "run (or resume) the RL training recipe of a config: single-turn warm-up, RFT, value pretraining and agentic PPO (docs/training.md)");
  bool train_resume = false;
  train->add_option("--config", flags.config, "training config YAML (configs/paper.yaml lists every key)")->required();
  train->add_option("--set", flags.sets, "override one key, e.g. --set ppo.steps=10 (repeatable)");
  train->add_flag("--resume", train_resume, "continue the run in run.output_dir from its latest checkpoint");
  train->add_option("--device", device, "cuda (default) or cpu (model on the CPU, verify-only scoring)");
  train->add_option("--gpu", gpu, "GPU index of the model and the episodes' checks");
  train->add_option("--skill", skill_file, "SKILL.md loaded into the agent's system prompt");
  train->add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off");

  CLI::App* ablate = app.add_subcommand(
      "ablate", "train the base recipe and each ablation config with the same seeds and scale, then compare them");
  std::string ablations_dir = "configs/ablations", ablate_out = "runs/ablate";
  ablate->add_option("--config", flags.config, "the base recipe, e.g. configs/learning.yaml")->required();
  ablate->add_option("--ablations", ablations_dir, "folder of ablation configs, one variant per *.yaml (default "
                     "configs/ablations)");
  ablate->add_option("--output", ablate_out, "where the runs and comparison.md go (default runs/ablate)");
  ablate->add_option("--set", flags.sets, "override one key in every variant (repeatable)");
  ablate->add_option("--device", device, "cuda (default) or cpu");
  ablate->add_option("--gpu", gpu, "GPU index of the model and the episodes' checks");
  ablate->add_option("--skill", skill_file, "SKILL.md loaded into the agent's system prompt");
  ablate->add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off");

  CLI::App* doctor = app.add_subcommand("doctor", "show what this machine has for evaluations and what is missing");
  doctor->add_flag("--json", json, "print the report as JSON");

  CLI::App* compile = app.add_subcommand("compile", "compile a CUDA C++ file with NVRTC (no GPU needed) and print the log");
  std::string source_file, arch = "sm_90";
  std::vector<std::string> name_expressions, nvrtc_options;
  compile->add_option("source", source_file, "the .cu file")->required();
  compile->add_option("--arch", arch, "target architecture, e.g. sm_90");
  compile->add_option("--name-expression", name_expressions, "template instantiation to lower (repeatable)");
  compile->add_option("--option", nvrtc_options, "extra NVRTC option (repeatable)");

  CLI::App* generate = app.add_subcommand("generate", "generate text with a policy model (HF folder or .gguf), streamed");
  GenerateFlags gen;
  generate->add_option("--model", gen.model, "Hugging Face folder or .gguf file")->required();
  generate->add_option("--prompt", gen.prompt, "raw text to continue (no chat template)");
  generate->add_option("--chat", gen.chat, "one user message, through the model's chat template");
  generate->add_option("--messages", gen.messages, "JSON file: OpenAI messages array, or {\"messages\": [...], \"tools\": [...]}");
  generate->add_option("--system", gen.system, "system message put first (with --chat / --messages)");
  generate->add_option("--max-tokens", gen.max_tokens, "most new tokens (default 256)");
  generate->add_option("--temperature", gen.temperature, "sampling temperature; 0 is greedy (default 0.7)");
  generate->add_option("--top-p", gen.top_p, "nucleus sampling mass (default 1)");
  generate->add_option("--top-k", gen.top_k, "keep the k most likely tokens; 0 keeps all (default 0)");
  generate->add_option("--seed", gen.seed, "sampling seed (default 0)");
  generate->add_option("--device", gen.device, "cpu (default), cuda or cuda:N");
  generate->add_option("--dtype", gen.dtype, "float32 (default) or bfloat16");
  generate->add_flag("--raw", gen.raw, "feed the --chat text verbatim, without the chat template");

  CLI::App* serve = app.add_subcommand("serve", "serve a policy model over an OpenAI-compatible HTTP API");
  policy::ServeOptions serve_opts;
  std::string serve_log_level = "info";
  serve->add_option("--model", gen.model, "Hugging Face folder or .gguf file")->required();
  serve->add_option("--host", serve_opts.host, "address to listen on (default 127.0.0.1)");
  serve->add_option("--port", serve_opts.port, "port (default 8000; 0 picks a free one)")
      ->check(CLI::Range(0, 65535).description("a port number from 0 (any free one) to 65535"));
  serve->add_option("--device", gen.device, "cpu (default), cuda or cuda:N");
  serve->add_option("--dtype", gen.dtype, "float32 (default) or bfloat16");
  serve->add_option("--model-name", serve_opts.model_name, "model id in replies (default: the file or folder name)");
  serve->add_option("--max-tokens", serve_opts.default_max_tokens, "max_tokens of requests that set none (default 1024)");
  serve->add_option("--log-level", serve_log_level, "trace, debug, info (default: one line per request), warn, error or off");

  // An evaluation's two processes (sandbox/evaluation.h): the judge (--request, --result) and
  // the candidate process the judge starts (--candidate, its channel as descriptor 3).
  CLI::App* worker = app.add_subcommand("worker", "(internal) an evaluation's judge or candidate process");
  worker->group("");
  std::string request_path, result_path, candidate_request;
  worker->add_option("--request", request_path);
  worker->add_option("--result", result_path);
  worker->add_option("--candidate", candidate_request);

  // The agent's Bash under `confine: namespaces` (agent/tool_support.cpp): confine this fresh,
  // single-threaded process, then exec the command.
  CLI::App* confined = app.add_subcommand("confined-exec", "(internal) run a command confined: the agent's Bash");
  confined->group("");
  std::vector<std::string> confined_writable, confined_read_only;
  confined->add_option("--writable", confined_writable)->allow_extra_args(false);  // one path each, repeatable
  confined->add_option("--read-only", confined_read_only)->allow_extra_args(false);
  confined->prefix_command();  // the first word that is not an option starts the command

  // The first word names the command: one that names none is an error, with --help too (CLI11
  // would print the main help and succeed, or say only that a command is required).
  if (argc > 1 && argv[1][0] != '-') {
    const std::string verb = argv[1];
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      found = found || sub->get_name() == verb;
      if (!sub->get_group().empty()) known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::cerr << fmt::format("cuda-agent: unknown command '{}'. The commands: {}. See cuda-agent --help.\n", verb,
                               known);
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints the message (or the help); CLI11's own codes (105, 106, ...) become ours.
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  if (confined->parsed()) {
    ConfinementPlan plan;
    plan.writable = confined_writable;
    plan.read_only = confined_read_only;
    plan.private_dirs = {"/tmp"};
    return exec_confined(plan, confined->remaining(), private_cache_env());
  }

  try {
    for (const auto& [verb, cmd] : single)
      if (cmd->parsed()) return run_single(verb, task, solution, device, gpu, gpu_lock, output, json, flags);

    if (compare->parsed()) {
      nlohmann::json comparison = bench::compare_runs(run_a, run_b);
      std::cout << (json ? comparison.dump(2) + "\n" : bench::render_compare_md(comparison));
      return 0;
    }
    if (bench->parsed()) {
      CA_CHECK(!split.empty() && !solutions.empty(),
               "bench needs --split and --solutions (or the subcommand: bench compare RUN_A RUN_B)");
      bench::BenchOptions opts;
      opts.sandbox = resolve_options(flags);
      opts.split = split;
      opts.solutions = solutions;
      opts.gpus = parse_gpus(gpus);
      opts.resume = !no_resume;
      opts.workers_per_gpu = workers_per_gpu;
      opts.output_dir = bench_out.empty() ? fs::path("runs") / ("bench-" + bench::split_name(split)) : fs::path(bench_out);
      require_gpu("bench");
      opts.interactive_progress = stderr_is_terminal();
      nlohmann::json report = bench::run_bench(opts, std::cerr);
      std::cout << bench::format_table(report["results"], report["summary"]);
      std::cout << fmt::format("\nresults: {}\n", (opts.output_dir / "results").string());
      return 0;
    }
    if (baselines->parsed()) {
      bench::BenchOptions opts;
      opts.sandbox = resolve_options(flags);
      opts.mode = sandbox::EvalMode::kBaselines;
      opts.split = split;
      opts.gpus = parse_gpus(gpus);
      opts.workers_per_gpu = workers_per_gpu;
      opts.output_dir = bench_out.empty() ? fs::path("runs") / ("baselines-" + bench::split_name(split))
                                          : fs::path(bench_out);
      opts.interactive_progress = stderr_is_terminal();
      require_gpu("baselines");
      nlohmann::json report = bench::run_bench(opts, std::cerr);
      std::cout << bench::format_baselines_table(report["results"]);
      return 0;
    }
    if (synth->parsed()) {
      set_log_level(flags.log_level);
      if (!synth_refresh.empty()) {
        bench::refresh_catalogue(synth_refresh);
        std::cout << fmt::format("catalogue: {}\n", synth_refresh);
        return 0;
      }
      CA_CHECK(!output.empty(), "synth needs --output DIR (the split folder to write)");
      CA_CHECK(device == "cuda" || device == "cpu", "synth: --device '{}' is unknown: use cuda or cpu", device);
      synth_opts.output = output;
      synth_opts.catalogue = synth_catalogue;
      synth_opts.from_split = synth_from;
      synth_opts.kernelbench = synth_kb;
      synth_opts.min_eager_ms = synth_window.at(0);
      synth_opts.max_eager_ms = synth_window.at(1);
      std::unique_ptr<agent::Policy> composer;
      if (synth_composer != "sampler") {
        composer = agent::make_policy(synth_composer);
        synth_opts.llm_name = composer->name();
        synth_opts.llm_prompt = read_file(synth_prompt);
        synth_opts.llm = [&composer](const std::string& prompt) {
          agent::PolicyRequest req;
          req.messages.push_back({"user", prompt, {}, "", ""});
          return composer->complete(req).text;
        };
      }
      synth_opts.bench.sandbox = resolve_options(flags);
      synth_opts.bench.device = device;
      synth_opts.bench.gpus = device == "cpu" ? std::vector<int>{0} : parse_gpus(gpus);
      synth_opts.bench.workers_per_gpu = workers_per_gpu;
      synth_opts.bench.interactive_progress = stderr_is_terminal();
      if (device == "cuda") require_gpu("synth");
      const nlohmann::json funnel = bench::run_synth(synth_opts, std::cerr);
      std::cout << read_file(fs::path(output) / "funnel.md")
                << fmt::format("split: {} ({} tasks)\n", output, funnel["accepted"].get<int>());
      return 0;
    }
    if (solve->parsed()) {
      agent::EpisodeSpec spec;
      spec.sandbox = resolve_options(flags);
      spec.task = task;
      spec.policy = policy_spec;
      spec.skill_file = skill_file;
      spec.device = device;
      spec.gpu = gpu;
      spec.agent.max_turns = max_turns;
      spec.agent.single_turn = single_turn;
      spec.output_dir = output.empty() ? fs::path("runs") / fmt::format("solve-{}-{}", fs::absolute(task).parent_path().filename().string(),
                                                                        std::time(nullptr))
                                       : fs::path(output);
      if (device == "cuda") require_gpu("solve");
      agent::EpisodeResult r = agent::run_task_episode(spec, [](const nlohmann::json& event) {
        std::cout << agent::format_event(event) << std::flush;
      });
      std::cout << fmt::format("trajectory: {}\n", (spec.output_dir / "trajectory.jsonl").string());
      return r.reward > 0 ? 0 : kExitFailed;
    }
    if (eval->parsed()) {
      agent::EvalSpec spec;
      spec.split = split;
      spec.gpus = parse_gpus(gpus);
      spec.output_dir = bench_out.empty()
                            ? fs::path("runs") / fmt::format("eval-{}-{}", bench::split_name(split), std::time(nullptr))
                            : fs::path(bench_out);
      spec.interactive_progress = stderr_is_terminal();
      spec.episode.sandbox = resolve_options(flags);
      if (!eval_checkpoint.empty()) {
        const size_t q = eval_checkpoint.find('?');
        policy_spec = rl::checkpoint_policy_spec(eval_checkpoint.substr(0, q), device,
                                                 q == std::string::npos ? "" : eval_checkpoint.substr(q + 1));
        std::cerr << "[eval] policy " << policy_spec << "\n";
      }
      CA_CHECK(!policy_spec.empty(), "eval: pass --policy SPEC or --checkpoint DIR");
      spec.episode.policy = policy_spec;
      spec.episode.skill_file = skill_file;
      spec.episode.device = device;
      spec.episode.agent.max_turns = max_turns;
      spec.episode.agent.single_turn = single_turn;
      if (device == "cuda") require_gpu("eval");
      nlohmann::json out = agent::run_eval(spec, std::cerr);
      std::cout << read_file(spec.output_dir / "report.md");
      return 0;
    }
    if (train->parsed()) {
      set_log_level(flags.log_level);
      const nlohmann::json config = rl::load_train_config(flags.config, flags.sets);
      rl::TrainRunOptions opts;
      opts.resume = train_resume;
      opts.device = device;
      opts.gpu = gpu;
      opts.skill_file = skill_file;
      if (device == "cuda") require_gpu("train");
      install_stop_handlers();
      try {
        const rl::TrainRunSummary summary = rl::run_training(config, opts, std::cerr);
        std::cout << fmt::format("run: {} ({} steps run, last step {})\n", summary.run_dir.string(), summary.steps_run,
                                 summary.last_step);
        return 0;
      } catch (const StopRequested& stop) {
        const fs::path run_dir = config["run"]["output_dir"].get<std::string>();
        const rl::CheckpointInfo ckpt = rl::latest_checkpoint(run_dir);
        std::cerr << fmt::format("[train] {}. {}\n", stop.what(),
                                 ckpt.step >= 0 ? fmt::format("The last checkpoint is step {} ({}): continue with --resume",
                                                              ckpt.step, ckpt.dir.string())
                                                : std::string("No checkpoint was written yet: running the same command "
                                                              "again starts over"));
        return 128 + stop.signal();
      }
    }
    if (ablate->parsed()) {
      set_log_level(flags.log_level);
      rl::AblationOptions opts;
      opts.base_config = flags.config;
      opts.ablations_dir = ablations_dir;
      opts.output_dir = ablate_out;
      opts.set_overrides = flags.sets;
      opts.train.device = device;
      opts.train.gpu = gpu;
      opts.train.skill_file = skill_file;
      (void)rl::ablation_variants(opts);  // every variant's config checked before the GPU is
      if (device == "cuda") require_gpu("ablate");
      install_stop_handlers();
      try {
        const std::vector<rl::AblationVariant> variants = rl::run_ablations(opts, std::cerr);
        std::cout << read_file(fs::path(ablate_out) / "comparison.md");
        return std::all_of(variants.begin(), variants.end(), [](const rl::AblationVariant& v) { return v.ok; }) ? 0 : 1;
      } catch (const StopRequested& stop) {
        std::cerr << fmt::format("[ablate] {}. Running the same command again continues each variant from its latest "
                                 "checkpoint\n", stop.what());
        return 128 + stop.signal();
      }
    }
    if (doctor->parsed()) {
      set_log_level("error");
      nlohmann::json report = sandbox::run_doctor();
      if (json) std::cout << report.dump(2) << "\n";
      else std::cout << sandbox::format_doctor(report);
      return report["ready_for_gpu_evaluation"].get<bool>() ? 0 : 1;
    }
    if (compile->parsed()) {
      sandbox::NvrtcCompiler compiler;
      sandbox::CompileOptions opts;
      opts.arch = arch;
      opts.name_expressions = name_expressions;
      opts.options = nvrtc_options;
      opts.program_name = fs::path(source_file).filename().string();
      auto program = compiler.compile(read_file(source_file), opts);
      if (!program.ok) {
        std::cout << program.error_report();
        return kExitFailed;
      }
      std::cout << fmt::format("ok: {} bytes of {} CUBIN in {:.3f} s (NVRTC {})\n", program.cubin.size(), arch,
                               program.compile_seconds, sandbox::NvrtcCompiler::nvrtc_version());
      for (const auto& [expr, lowered] : program.lowered_names) std::cout << fmt::format("  {} -> {}\n", expr, lowered);
      if (!program.log.empty()) std::cout << program.log << "\n";
      return 0;
    }
    if (generate->parsed()) {
      set_log_level("warn");
      return run_generate(gen);
    }
    if (serve->parsed()) {
      set_log_level(serve_log_level);
      policy::LmOptions lm;
      lm.device = gen.device;
      lm.dtype = gen.dtype;
      auto session = policy::ChatSession::open(gen.model, lm);
      policy::run_openai_server(*session, serve_opts);
      return 0;
    }
    if (worker->parsed()) {
      int code = 0;
      if (!candidate_request.empty()) {
        code = sandbox::run_candidate_process(candidate_request);
      } else {
        CA_CHECK(!request_path.empty() && !result_path.empty(), "worker needs --request and --result, or --candidate");
        sandbox::EvalRequest req = sandbox::EvalRequest::from_json(nlohmann::json::parse(read_file(request_path)));
        sandbox::run_judge_process(req, result_path);
      }
      std::cout.flush();
      std::fflush(nullptr);
      // The interpreter, torch and CUDA tear down badly at exit; the result is on disk.
      std::_Exit(code);
    }
  } catch (const std::exception& e) {
    std::cerr << "cuda-agent: " << e.what() << "\n";
    return kExitUsage;
  }
  return 0;
}

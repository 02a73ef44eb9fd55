// cuda-agent: the command-line verbs. Verbs parse options and call the components; no logic.
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>

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
#include "cuda_agent/export/export.h"
#include "cuda_agent/rl/ablation.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/rl/trainer.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/doctor.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/serve/chat_session.h"
#include "cuda_agent/serve/local_policy.h"
#include "cuda_agent/serve/openai_server.h"

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
  lm::LmOptions lm;
  lm.device = g.device;
  lm.dtype = g.dtype;
  const auto t_load = std::chrono::steady_clock::now();
  auto session = serve::ChatSession::open(g.model, lm);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  serve::ChatRequestOptions opts;
  opts.sampling.temperature = g.temperature;
  opts.sampling.top_p = g.top_p;
  opts.sampling.top_k = g.top_k;
  opts.sampling.max_new_tokens = g.max_tokens;
  opts.sampling.seed = g.seed;
  auto print = [](const std::string& delta) {
    std::cout << delta << std::flush;
    return true;
  };
  serve::ChatReply reply;
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

// ---- the verbs ---------------------------------------------------------------------------
// Each add_* function declares one verb's options on its own subcommand and adds the function
// that runs it; main() parses the command line and runs the verb it names.

struct Verb {
  CLI::App* cmd;
  std::function<int()> run;
};
using Verbs = std::vector<Verb>;

constexpr const char* kWorkersHelp =
    "worker processes in flight per GPU: 2 starts the next worker's Python while the current one runs (GPU phases "
    "and timed runs stay one at a time; 1 runs one evaluation at a time; docs/benchmarks.md, section 5)";
const std::string kDefaultSkill = std::string(CUDA_AGENT_SKILLS_DIR) + "/cuda-kernel-sandbox/SKILL.md";

struct SingleFlags {
  std::string task, solution, device = "cuda", output;
  int gpu = 0;
  bool json = false, gpu_lock = false;
  CommonFlags common;
};

void add_single_verbs(CLI::App& app, Verbs& verbs) {
  for (const std::string verb : {"verify", "profile", "evaluate"}) {
    auto f = std::make_shared<SingleFlags>();
    const char* help = verb == "verify"    ? "check a solution against its task on five seeded random inputs"
                       : verb == "profile" ? "time eager, torch.compile and the solution"
                                           : "verify, then profile, then score the solution (reward -1/1/2/3)";
    CLI::App* cmd = app.add_subcommand(verb, help);
    cmd->add_option("--task", f->task, "the task's model.py (KernelBench format), or its folder")->required();
    cmd->add_option("--solution", f->solution, "the solution's model_new.py, or its folder")->required();
    cmd->add_option("--device", f->device,
                    verb == "verify" ? "cuda (default), or cpu: no GPU, the checks only"
                                     : "cuda (the default and the only choice: timing needs a GPU)");
    cmd->add_option("--gpu", f->gpu, "GPU index to pin the worker to");
    cmd->add_option("--output", f->output, "write the result JSON here");
    cmd->add_flag("--json", f->json, "print the result JSON instead of the summary");
    cmd->add_flag("--gpu-lock", f->gpu_lock,
                  "take the GPU's lock files: GPU work and timed runs one at a time with other locked runs");
    add_common(cmd, f->common);
    verbs.push_back({cmd, [verb, f] {
                       return run_single(verb, f->task, f->solution, f->device, f->gpu, f->gpu_lock, f->output, f->json,
                                         f->common);
                     }});
  }
}

struct BenchFlags {
  std::string split, solutions, gpus = "0", output, run_a, run_b;
  bool no_resume = false, json = false;
  int workers_per_gpu = 2;
  std::string baselines = "first";
  CommonFlags common;
};

// What bench and baselines share: the split, the GPUs and workers, the run folder
// (runs/<prefix>-<split> unless --output), the sandbox options and the progress bar.
bench::BenchOptions bench_options(const BenchFlags& f, const std::string& prefix) {
  bench::BenchOptions opts;
  opts.sandbox = resolve_options(f.common);
  opts.split = f.split;
  opts.gpus = parse_gpus(f.gpus);
  opts.workers_per_gpu = f.workers_per_gpu;
  opts.output_dir =
      f.output.empty() ? fs::path("runs") / (prefix + "-" + bench::split_name(f.split)) : fs::path(f.output);
  opts.interactive_progress = stderr_is_terminal();
  return opts;
}

void add_bench(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* bench = app.add_subcommand("bench", "score the solutions of a split and print the result table");
  bench->add_option("--split", f->split,
                    "split: a folder with split.yaml, a KernelBench folder (level1/...), or rows (.jsonl/.parquet)");
  bench->add_option("--solutions", f->solutions, "folder of solutions: <id>/model_new.py or <id>.py");
  bench->add_option("--gpus", f->gpus, "comma-separated GPU indices to spread evaluations over");
  bench->add_option("--output", f->output, "run folder (default runs/bench-<split>)");
  bench->add_flag("--no-resume", f->no_resume, "re-evaluate tasks that already have a result");
  bench->add_option("--workers-per-gpu", f->workers_per_gpu, kWorkersHelp)->check(CLI::Range(1, 16));
  bench
      ->add_option("--baselines", f->baselines,
                   "first (default): the baselines the scoring cache lacks timed before any solution runs, by "
                   "judges without a candidate; lazy: each evaluation times those it lacks, beside its solution")
      ->check(CLI::IsMember({"first", "lazy"}));
  add_common(bench, f->common);
  CLI::App* compare = bench->add_subcommand("compare", "show two bench runs side by side, per task and per level");
  compare->add_option("run_a", f->run_a, "the first run folder (holding results/)")->required();
  compare->add_option("run_b", f->run_b, "the second run folder")->required();
  compare->add_flag("--json", f->json, "print the comparison as JSON");
  // `bench compare` first: `bench` counts as parsed when its subcommand is.
  verbs.push_back({compare, [f] {
                     nlohmann::json comparison = bench::compare_runs(f->run_a, f->run_b);
                     std::cout << (f->json ? comparison.dump(2) + "\n" : bench::render_compare_md(comparison));
                     return 0;
                   }});
  verbs.push_back({bench, [f] {
                     CA_CHECK(!f->split.empty() && !f->solutions.empty(),
                              "bench needs --split and --solutions (or the subcommand: bench compare RUN_A RUN_B)");
                     bench::BenchOptions opts = bench_options(*f, "bench");
                     opts.solutions = f->solutions;
                     opts.resume = !f->no_resume;
                     opts.baselines_first = f->baselines == "first";
                     require_gpu("bench");
                     nlohmann::json report = bench::run_bench(opts, std::cerr);
                     std::cout << bench::format_table(report["results"], report["summary"]);
                     std::cout << fmt::format("\nresults: {}\n", (opts.output_dir / "results").string());
                     return 0;
                   }});
}

void add_baselines(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "baselines", "time eager and torch.compile for every task of a split into the shared baseline cache");
  cmd->add_option("--split", f->split, "split folder (with split.yaml)")->required();
  cmd->add_option("--gpus", f->gpus, "comma-separated GPU indices to spread tasks over");
  cmd->add_option("--output", f->output, "run folder (default runs/baselines-<split>)");
  cmd->add_option("--workers-per-gpu", f->workers_per_gpu, kWorkersHelp)->check(CLI::Range(1, 16));
  add_common(cmd, f->common);
  verbs.push_back({cmd, [f] {
                     bench::BenchOptions opts = bench_options(*f, "baselines");
                     opts.mode = sandbox::EvalMode::kBaselines;
                     require_gpu("baselines");
                     nlohmann::json report = bench::run_bench(opts, std::cerr);
                     std::cout << bench::format_baselines_table(report["results"]);
                     return 0;
                   }});
}

// solve and eval: agent episodes.
struct AgentFlags {
  std::string task, split, policy, checkpoint, output, gpus = "0", device = "cuda", skill = kDefaultSkill;
  int gpu = 0, max_turns = 150, episodes_per_gpu = 1;
  std::string baselines = "first";
  bool single_turn = false;
  CommonFlags common;
};

void add_solve(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<AgentFlags>();
  CLI::App* cmd = app.add_subcommand("solve", "one agent episode on a task, transcript streamed, trajectory saved");
  cmd->add_option("--task", f->task, "the task's model.py")->required();
  cmd->add_option("--policy", f->policy,
                  "replay:FILE.jsonl (scripted tool calls), openai:MODEL@BASE_URL or local:MODEL[?temperature=T&...] "
                  "(the in-process model; docs/agent.md)")
      ->required();
  cmd->add_option("--output", f->output, "episode folder (default runs/solve-<task>-<time>)");
  cmd->add_option("--skill", f->skill, "SKILL.md loaded into the system prompt");
  cmd->add_option("--max-turns", f->max_turns, "most policy replies (default 150)");
  cmd->add_flag("--single-turn", f->single_turn,
                "no tools: one answer holding model_new.py (the no-agent-loop ablation)");
  cmd->add_option("--device", f->device, "cuda (default) or cpu (verify-only scoring)");
  cmd->add_option("--gpu", f->gpu, "GPU index for the episode's checks");
  add_common(cmd, f->common);
  verbs.push_back({cmd, [f] {
                     agent::EpisodeSpec spec;
                     spec.sandbox = resolve_options(f->common);
                     spec.task = f->task;
                     spec.policy = f->policy;
                     spec.skill_file = f->skill;
                     spec.device = f->device;
                     spec.gpu = f->gpu;
                     spec.agent.max_turns = f->max_turns;
                     spec.agent.single_turn = f->single_turn;
                     spec.output_dir =
                         f->output.empty()
                             ? fs::path("runs") / fmt::format("solve-{}-{}",
                                                              fs::absolute(f->task).parent_path().filename().string(),
                                                              std::time(nullptr))
                             : fs::path(f->output);
                     if (f->device == "cuda") require_gpu("solve");
                     agent::EpisodeResult r = agent::run_task_episode(spec, [](const nlohmann::json& event) {
                       std::cout << agent::format_event(event) << std::flush;
                     });
                     std::cout << fmt::format("trajectory: {}\n", (spec.output_dir / "trajectory.jsonl").string());
                     return r.reward > 0 ? 0 : kExitFailed;
                   }});
}

void add_eval(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<AgentFlags>();
  CLI::App* cmd = app.add_subcommand("eval", "agent episodes over a split, scored, with the bench report");
  cmd->add_option("--split", f->split, "split: own folder, KernelBench folder, or rows (.jsonl/.parquet)")->required();
  CLI::Option* policy =
      cmd->add_option("--policy", f->policy, "replay:FILE.jsonl, openai:MODEL@BASE_URL or local:MODEL[?key=value&...]");
  cmd->add_option("--checkpoint", f->checkpoint,
                  "a training run folder (its latest checkpoint) or a checkpoints/step-N folder, optionally "
                  "?key=value&... as local: takes (e.g. ?temperature=0): its actor is the policy")
      ->excludes(policy);
  cmd->add_option("--gpus", f->gpus, "comma-separated GPU indices to spread episodes over");
  cmd->add_option("--episodes-per-gpu", f->episodes_per_gpu,
                  "episodes at once on each GPU (default 1); above 1 their timed runs take the GPU's locks, one at "
                  "a time, and each episode loads its own policy")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--baselines", f->baselines,
                  "first (default): every task's baselines timed into the scoring cache before the episodes; lazy: "
                  "only where a solution needs them (for a policy that solves few tasks)")
      ->check(CLI::IsMember({"first", "lazy"}));
  cmd->add_option("--output", f->output, "run folder (default runs/eval-<split>-<time>)");
  cmd->add_option("--skill", f->skill, "SKILL.md loaded into the system prompt");
  cmd->add_option("--max-turns", f->max_turns, "most policy replies per episode (the paper evaluates with 200)");
  cmd->add_flag("--single-turn", f->single_turn, "no tools: one answer per task (the no-agent-loop ablation)");
  cmd->add_option("--device", f->device, "cuda (default) or cpu (verify-only scoring)");
  add_common(cmd, f->common);
  verbs.push_back({cmd, [f] {
                     agent::EvalSpec spec;
                     spec.split = f->split;
                     spec.gpus = parse_gpus(f->gpus);
                     spec.episodes_per_gpu = f->episodes_per_gpu;
                     spec.baselines_first = f->baselines == "first";
                     spec.output_dir = f->output.empty()
                                           ? fs::path("runs") / fmt::format("eval-{}-{}", bench::split_name(f->split),
                                                                            std::time(nullptr))
                                           : fs::path(f->output);
                     spec.interactive_progress = stderr_is_terminal();
                     spec.episode.sandbox = resolve_options(f->common);
                     std::string policy = f->policy;
                     if (!f->checkpoint.empty()) {
                       const size_t q = f->checkpoint.find('?');
                       policy = rl::checkpoint_policy_spec(f->checkpoint.substr(0, q), f->device,
                                                           q == std::string::npos ? "" : f->checkpoint.substr(q + 1));
                       std::cerr << "[eval] policy " << policy << "\n";
                     }
                     CA_CHECK(!policy.empty(), "eval: pass --policy SPEC or --checkpoint DIR");
                     spec.episode.policy = policy;
                     spec.episode.skill_file = f->skill;
                     spec.episode.device = f->device;
                     spec.episode.agent.max_turns = f->max_turns;
                     spec.episode.agent.single_turn = f->single_turn;
                     if (f->device == "cuda") require_gpu("eval");
                     nlohmann::json out = agent::run_eval(spec, std::cerr);
                     std::cout << read_file(spec.output_dir / "report.md");
                     return 0;
                   }});
}

struct SynthFlags {
  bench::SynthOptions opts;
  std::string output, device = "cuda", gpus = "0", composer = "sampler",
                      prompt = std::string(CUDA_AGENT_DATA_DIR) + "/synth/compose_prompt.md",
                      catalogue = std::string(CUDA_AGENT_DATA_DIR) + "/synth/catalogue.json", refresh, from_split,
                      kernelbench;
  std::vector<double> window = {1, 100};
  int workers_per_gpu = 0;  // 0: 8 sharing the GPU, 2 with --exclusive-timing or on the CPU
  CommonFlags common;
};

int run_synth_verb(SynthFlags& f) {
  set_log_level(f.common.log_level);
  if (!f.refresh.empty()) {
    bench::refresh_catalogue(f.refresh);
    std::cout << fmt::format("catalogue: {}\n", f.refresh);
    return 0;
  }
  CA_CHECK(!f.output.empty(), "synth needs --output DIR (the split folder to write)");
  CA_CHECK(f.device == "cuda" || f.device == "cpu", "synth: --device '{}' is unknown: use cuda or cpu", f.device);
  bench::SynthOptions& o = f.opts;
  o.output = f.output;
  o.catalogue = f.catalogue;
  o.from_split = f.from_split;
  o.kernelbench = f.kernelbench;
  o.min_eager_ms = f.window.at(0);
  o.max_eager_ms = f.window.at(1);
  std::unique_ptr<agent::Policy> composer;
  if (f.composer != "sampler") {
    composer = agent::make_policy(f.composer);
    o.llm_name = composer->name();
    o.llm_prompt = read_file(f.prompt);
    o.llm = [&composer](const std::string& prompt) {
      agent::PolicyRequest req;
      req.messages.push_back({"user", prompt, {}, "", ""});
      return composer->complete(req).text;
    };
  }
  o.bench.sandbox = resolve_options(f.common);
  o.bench.device = f.device;
  o.bench.gpus = f.device == "cpu" ? std::vector<int>{0} : parse_gpus(f.gpus);
  o.bench.workers_per_gpu =
      f.workers_per_gpu > 0 ? f.workers_per_gpu : (o.exclusive_timing || f.device == "cpu" ? 2 : 8);
  o.bench.interactive_progress = stderr_is_terminal();
  if (f.device == "cuda") require_gpu("synth");
  const nlohmann::json funnel = bench::run_synth(o, std::cerr);
  std::cout << read_file(fs::path(f.output) / "funnel.md")
            << fmt::format("split: {} ({} tasks)\n", f.output, funnel["accepted"].get<int>());
  return 0;
}

void add_synth(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<SynthFlags>();
  CLI::App* cmd = app.add_subcommand(
      "synth",
      "make training tasks: compose catalogue ops into KernelBench-format models and keep those that pass "
      "the filters (docs/synth.md)");
  cmd->add_option("--output", f->output, "the split folder to write (split.yaml, tasks/, funnel.md, work/)");
  cmd->add_option("--count", f->opts.count, "candidates to compose (default 300)")->check(CLI::Range(1, 1000000));
  cmd->add_option("--seed", f->opts.seed, "seed of the composition (default 0)");
  cmd->add_option("--max-ops", f->opts.max_ops, "ops per model, at most (1-5, default 5)")->check(CLI::Range(1, 5));
  cmd->add_option("--composer", f->composer,
                  "sampler (the built-in typed sampler, the default) or a policy spec: openai:MODEL@URL, local:MODEL, "
                  "replay:FILE.jsonl");
  cmd->add_option("--prompt", f->prompt, "the LLM composer's prompt template ({ops}, {max_ops} filled in)");
  cmd->add_option("--catalogue", f->catalogue, "the op catalogue (default data/synth/catalogue.json)");
  cmd->add_option("--refresh-catalogue", f->refresh, "crawl the op catalogue into this file and stop");
  cmd->add_option("--from-split", f->from_split,
                  "filter this split's tasks instead of composing: a split folder or Ops-6K rows (.jsonl/.parquet)");
  cmd->add_option("--kernelbench", f->kernelbench,
                  "a KernelBench folder (level1/ ...): drop tasks too similar to its tasks");
  cmd->add_option("--eager-window", f->window, "eager time window in ms, MIN MAX (default 1 100)")->expected(2);
  cmd->add_option("--max-similarity", f->opts.max_similarity, "AST similarity above this drops a task (default 0.9)");
  cmd->add_option("--device", f->device, "cuda (default: every filter) or cpu (no torch.compile or timing filter)");
  cmd->add_option("--gpus", f->gpus, "comma-separated GPU indices to spread evaluations over");
  cmd->add_option("--workers-per-gpu", f->workers_per_gpu,
                  "evaluations in flight per GPU (default 8 sharing the GPU; 2 with --exclusive-timing or on the CPU)")
      ->check(CLI::Range(1, 16));
  cmd->add_flag("--exclusive-timing", f->opts.exclusive_timing,
                "time each candidate's eager run alone on the GPU (the bench's GPU lock): slower; by default "
                "evaluations share the GPU and the eager time is a load under contention");
  add_common(cmd, f->common);
  verbs.push_back({cmd, [f] { return run_synth_verb(*f); }});
}

// train and ablate: the trainer.
constexpr const char* kSharedGpuHelp =
    "other processes use this GPU (another run): episodes take its locks even one at a time, and the learner's GPU "
    "work holds its quiet lock, so that no evaluation times beside another process's work";

struct TrainFlags {
  std::string device = "cuda", skill = kDefaultSkill, ablations = "configs/ablations", output = "runs/ablate";
  int gpu = 0;
  bool resume = false;
  std::vector<std::string> variants;  // ablate --variants
  int parallel = 1;                   // ablate --parallel
  bool train_only = false;            // ablate --train-only: one variant's process of a parallel call
  bool shared_gpu = false;            // --shared-gpu: other processes use the GPU
  int gpu_processes = 1;              // ablate --gpu-processes: a parallel call's variant processes
  CommonFlags common;
};

void add_train(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train",
                                     "run (or resume) the RL training recipe of a config: single-turn warm-up, RFT, "
                                     "value pretraining and agentic PPO (docs/training.md)");
  cmd->add_option("--config", f->common.config, "training config YAML (configs/paper.yaml lists every key)")
      ->required();
  cmd->add_option("--set", f->common.sets, "override one key, e.g. --set ppo.steps=10 (repeatable)");
  cmd->add_flag("--resume", f->resume, "continue the run in run.output_dir from its latest checkpoint");
  cmd->add_option("--device", f->device, "cuda (default) or cpu (model on the CPU, verify-only scoring)");
  cmd->add_option("--gpu", f->gpu, "GPU index of the model and the episodes' checks");
  cmd->add_flag("--shared-gpu", f->shared_gpu, kSharedGpuHelp);
  cmd->add_option("--skill", f->skill, "SKILL.md loaded into the agent's system prompt");
  cmd->add_option("--log-level", f->common.log_level, "trace, debug, info, warn, error or off");
  verbs.push_back({cmd, [f] {
                     set_log_level(f->common.log_level);
                     const nlohmann::json config = rl::load_train_config(f->common.config, f->common.sets);
                     rl::TrainRunOptions opts;
                     opts.resume = f->resume;
                     opts.device = f->device;
                     opts.gpu = f->gpu;
                     opts.shared_gpu = f->shared_gpu;
                     opts.skill_file = f->skill;
                     if (f->device == "cuda") require_gpu("train");
                     install_stop_handlers();
                     try {
                       const rl::TrainRunSummary summary = rl::run_training(config, opts, std::cerr);
                       std::cout << fmt::format("run: {} ({} steps run, last step {})\n", summary.run_dir.string(),
                                                summary.steps_run, summary.last_step);
                       return 0;
                     } catch (const StopRequested& stop) {
                       const fs::path run_dir = config["run"]["output_dir"].get<std::string>();
                       const rl::CheckpointInfo ckpt = rl::latest_checkpoint(run_dir);
                       std::cerr << fmt::format(
                           "[train] {}. {}\n", stop.what(),
                           ckpt.step >= 0 ? fmt::format("The last checkpoint is step {} ({}): continue with --resume",
                                                        ckpt.step, ckpt.dir.string())
                                          : std::string("No checkpoint was written yet: running the same command "
                                                        "again starts over"));
                       return 128 + stop.signal();
                     }
                   }});
}

void add_ablate(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "ablate", "train the base recipe and each ablation config with the same seeds and scale, then compare them");
  cmd->add_option("--config", f->common.config, "the base recipe, e.g. configs/learning.yaml")->required();
  cmd->add_option("--ablations", f->ablations,
                  "folder of ablation configs, one variant per *.yaml (default configs/ablations)");
  cmd->add_option("--output", f->output, "where the runs and comparison.md go (default runs/ablate)");
  cmd->add_option("--set", f->common.sets, "override one key in every variant (repeatable)");
  cmd->add_option("--variants", f->variants,
                  "train only these variants (comma-separated: base, ablation file stems); the comparison reads the "
                  "others' earlier runs in --output")
      ->delimiter(',');
  cmd->add_option("--parallel", f->parallel,
                  "train up to N variants at once, each in a process of its own, after the stages they share "
                  "(default 1: one after another)");
  // A variant's process of a parallel call: it trains, the caller compares.
  cmd->add_flag("--train-only", f->train_only)->group("");
  cmd->add_option("--gpu-processes", f->gpu_processes)->group("");  // how many such processes share the GPU
  cmd->add_option("--device", f->device, "cuda (default) or cpu");
  cmd->add_option("--gpu", f->gpu, "GPU index of the model and the episodes' checks");
  cmd->add_flag("--shared-gpu", f->shared_gpu, kSharedGpuHelp);
  cmd->add_option("--skill", f->skill, "SKILL.md loaded into the agent's system prompt");
  cmd->add_option("--log-level", f->common.log_level, "trace, debug, info, warn, error or off");
  verbs.push_back(
      {cmd, [f] {
         set_log_level(f->common.log_level);
         rl::AblationOptions opts;
         opts.base_config = f->common.config;
         opts.ablations_dir = f->ablations;
         opts.output_dir = f->output;
         opts.set_overrides = f->common.sets;
         opts.only = f->variants;
         opts.parallel = f->parallel;
         opts.write_comparison = !f->train_only;
         // A parallel call's variant: asked to stop (at a safe point) when the call that started
         // it ends, however it ends.
         if (f->train_only) ::prctl(PR_SET_PDEATHSIG, SIGTERM);
         opts.train.device = f->device;
         opts.train.gpu = f->gpu;
         opts.train.shared_gpu = f->shared_gpu;
         opts.train.gpu_processes = f->gpu_processes;
         opts.train.skill_file = f->skill;
         (void)rl::ablation_variants(opts);  // every variant's config checked before the GPU is
         if (f->device == "cuda") require_gpu("ablate");
         install_stop_handlers();
         try {
           const std::vector<rl::AblationVariant> variants = rl::run_ablations(opts, std::cerr);
           const auto counted = [&](const rl::AblationVariant& v) {
             return !f->train_only || std::find(f->variants.begin(), f->variants.end(), v.name) != f->variants.end();
           };
           if (!f->train_only) std::cout << read_file(fs::path(f->output) / "comparison.md");
           return std::all_of(variants.begin(), variants.end(),
                              [&](const rl::AblationVariant& v) { return v.ok || !counted(v); })
                      ? 0
                      : 1;
         } catch (const StopRequested& stop) {
           std::cerr << fmt::format(
               "[ablate] {}. Running the same command again continues each variant "
               "from its latest checkpoint\n",
               stop.what());
           return 128 + stop.signal();
         }
       }});
}

void add_doctor(CLI::App& app, Verbs& verbs) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("doctor", "show what this machine has for evaluations and what is missing");
  cmd->add_flag("--json", *json, "print the report as JSON");
  verbs.push_back({cmd, [json] {
                     set_log_level("error");
                     nlohmann::json report = sandbox::run_doctor();
                     if (*json)
                       std::cout << report.dump(2) << "\n";
                     else
                       std::cout << sandbox::format_doctor(report);
                     return report["ready_for_gpu_evaluation"].get<bool>() ? 0 : 1;
                   }});
}

void add_export(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<exporter::ExportOptions>();
  CLI::App* cmd = app.add_subcommand(
      "export", "an evaluated solution as a Python package: its kernels precompiled, a guard, a fallback, an audit record");
  cmd->add_option("--result", f->result, "the evaluation's result JSON (evaluate --output, a bench's results/<id>.json)")
      ->required();
  cmd->add_option("--output", f->output, "the package folder to write; its name is the import name")->required();
  cmd->add_option("--solution", f->solution, "the solution's model_new.py or folder (default: the result's)");
  cmd->add_option("--task", f->task, "the task's model.py or folder (default: the result's)");
  cmd->add_option("--fallback", f->fallback, "what runs calls the guard turns away: compile (default) or eager");
  cmd->add_flag("--force", f->force, "replace an existing package folder");
  verbs.push_back({cmd, [f] {
                     set_log_level("error");
                     const exporter::ExportSummary s = exporter::export_solution(*f);
                     std::cout << fmt::format(
                         "exported {}: {} program(s), {} kernel(s) as {} cubin; import {} (PYTHONPATH={})\n"
                         "manifest sha256 {} (canary --expect-manifest pins it)\n",
                         s.package.string(), s.programs, s.kernels, s.arch, s.name, s.package.parent_path().string(),
                         s.manifest_sha256);
                     return 0;
                   }});
}

void add_canary(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<exporter::CanaryOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "canary", "check an exported package on this machine: its files, its kernels against the reference, its speed");
  cmd->add_option("package", f->package, "the package folder export wrote")->required();
  cmd->add_option("--trials", f->trials, "fresh input draws compared with the reference (default 5)");
  cmd->add_option("--runs", f->runs, "timed runs of the kernels and of the fallback, interleaved (default 30)");
  cmd->add_option("--margin", f->margin, "fail when slower than the fallback by more than this fraction (default 0.05)");
  cmd->add_option("--expect-manifest", f->expect_manifest, "the manifest's sha256 as export printed it");
  cmd->add_flag("--rollback", f->rollback, "on failure switch the package to its fallback (state.json)");
  cmd->add_flag("--json", *json, "print the outcome as JSON");
  verbs.push_back({cmd, [f, json] {
                     set_log_level("error");
                     const exporter::CanaryOutcome o = exporter::run_canary(*f);
                     if (*json) {
                       std::cout << nlohmann::json({{"ok", o.ok}, {"problem", o.problem}, {"rolled_back", o.rolled_back},
                                                    {"report", o.report}})
                                        .dump(2)
                                 << "\n";
                     } else if (o.ok) {
                       const auto& r = o.report;
                       std::cout << fmt::format("canary {}: ok: {} trials match the reference; kernels {:.4f} ms, "
                                                "fallback {:.4f} ms ({:.2f}x)\n",
                                                f->package.string(), r["trials"].size(), r.value("kernel_ms", 0.0),
                                                r.value("fallback_ms", 0.0), r.value("speedup_vs_fallback", 0.0));
                     } else {
                       std::cout << fmt::format("canary {}: FAILED: {}{}\n", f->package.string(), o.problem,
                                                o.rolled_back ? "; rolled back: the package runs its fallback" : "");
                     }
                     return o.ok ? 0 : kExitFailed;
                   }});
}

struct CompileFlags {
  std::string source, arch = "sm_90";
  std::vector<std::string> name_expressions, options;
};

void add_compile(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<CompileFlags>();
  CLI::App* cmd = app.add_subcommand("compile", "compile a CUDA C++ file with NVRTC (no GPU needed) and print the log");
  cmd->add_option("source", f->source, "the .cu file")->required();
  cmd->add_option("--arch", f->arch, "target architecture, e.g. sm_90");
  cmd->add_option("--name-expression", f->name_expressions, "template instantiation to lower (repeatable)");
  cmd->add_option("--option", f->options, "extra NVRTC option (repeatable)");
  verbs.push_back({cmd, [f] {
                     sandbox::NvrtcCompiler compiler;
                     sandbox::CompileOptions opts;
                     opts.arch = f->arch;
                     opts.name_expressions = f->name_expressions;
                     opts.options = f->options;
                     opts.program_name = fs::path(f->source).filename().string();
                     auto program = compiler.compile(read_file(f->source), opts);
                     if (!program.ok) {
                       std::cout << program.error_report();
                       return kExitFailed;
                     }
                     std::cout << fmt::format("ok: {} bytes of {} CUBIN in {:.3f} s (NVRTC {})\n", program.cubin.size(),
                                              f->arch, program.compile_seconds,
                                              sandbox::NvrtcCompiler::nvrtc_version());
                     for (const auto& [expr, lowered] : program.lowered_names)
                       std::cout << fmt::format("  {} -> {}\n", expr, lowered);
                     if (!program.log.empty()) std::cout << program.log << "\n";
                     return 0;
                   }});
}

void add_generate(CLI::App& app, Verbs& verbs) {
  auto g = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text with a policy model (HF folder or .gguf), streamed");
  cmd->add_option("--model", g->model, "Hugging Face folder or .gguf file")->required();
  cmd->add_option("--prompt", g->prompt, "raw text to continue (no chat template)");
  cmd->add_option("--chat", g->chat, "one user message, through the model's chat template");
  cmd->add_option("--messages", g->messages,
                  "JSON file: OpenAI messages array, or {\"messages\": [...], \"tools\": [...]}");
  cmd->add_option("--system", g->system, "system message put first (with --chat / --messages)");
  cmd->add_option("--max-tokens", g->max_tokens, "most new tokens (default 256)");
  cmd->add_option("--temperature", g->temperature, "sampling temperature; 0 is greedy (default 0.7)");
  cmd->add_option("--top-p", g->top_p, "nucleus sampling mass (default 1)");
  cmd->add_option("--top-k", g->top_k, "keep the k most likely tokens; 0 keeps all (default 0)");
  cmd->add_option("--seed", g->seed, "sampling seed (default 0)");
  cmd->add_option("--device", g->device, "cpu (default), cuda or cuda:N");
  cmd->add_option("--dtype", g->dtype, "float32 (default) or bfloat16");
  cmd->add_flag("--raw", g->raw, "feed the --chat text verbatim, without the chat template");
  verbs.push_back({cmd, [g] {
                     set_log_level("warn");
                     return run_generate(*g);
                   }});
}

struct ServeFlags {
  std::string model, device = "cpu", dtype = "float32", log_level = "info";
  serve::ServeOptions options;
};

void add_serve(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a policy model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", f->model, "Hugging Face folder or .gguf file")->required();
  cmd->add_option("--host", f->options.host, "address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", f->options.port, "port (default 8000; 0 picks a free one)")
      ->check(CLI::Range(0, 65535).description("a port number from 0 (any free one) to 65535"));
  cmd->add_option("--device", f->device, "cpu (default), cuda or cuda:N");
  cmd->add_option("--dtype", f->dtype, "float32 (default) or bfloat16");
  cmd->add_option("--model-name", f->options.model_name, "model id in replies (default: the file or folder name)");
  cmd->add_option("--max-tokens", f->options.default_max_tokens, "max_tokens of requests that set none (default 1024)");
  cmd->add_option("--log-level", f->log_level,
                  "trace, debug, info (default: one line per request), warn, error or off");
  verbs.push_back({cmd, [f] {
                     set_log_level(f->log_level);
                     lm::LmOptions lm;
                     lm.device = f->device;
                     lm.dtype = f->dtype;
                     auto session = serve::ChatSession::open(f->model, lm);
                     serve::run_openai_server(*session, f->options);
                     return 0;
                   }});
}

// The internal verbs. An evaluation's two processes (sandbox/evaluation.h): the judge
// (--judge, its job on descriptor 3) and the candidate process the judge starts when it cannot
// fork it (--candidate, its channel as descriptor 3). The agent's Bash under `confine:
// namespaces` (agent/tool_support.cpp): confine this fresh, single-threaded process, then exec
// the command.
struct InternalFlags {
  bool judge = false;
  int quiet_gpu = -1;
  std::string candidate;
  std::vector<std::string> writable, read_only, hidden, visible;
  bool signals_only = false;
  uint64_t tmpfs_bytes = 0, max_file_bytes = 0, max_disk_bytes = 0, max_memory_bytes = 0, max_gpu_memory_bytes = 0;
  std::vector<std::string> watched, gpu_locks;
};

void add_internal(CLI::App& app, Verbs& verbs) {
  auto f = std::make_shared<InternalFlags>();
  CLI::App* worker = app.add_subcommand("worker", "(internal) an evaluation's judge or candidate process");
  worker->group("");
  worker->add_flag("--judge", f->judge);
  worker->add_option("--quiet-gpu", f->quiet_gpu);
  worker->add_option("--candidate", f->candidate);
  verbs.push_back(
      {worker, [f] {
         CA_CHECK(f->judge != !f->candidate.empty(), "worker needs --judge or --candidate REQUEST");
         const int code = f->judge ? sandbox::run_judge_worker(f->quiet_gpu) : sandbox::run_candidate_process(f->candidate);
         std::cout.flush();
         std::fflush(nullptr);
         // The interpreter, torch and CUDA tear down badly at exit; the result is on disk.
         std::_Exit(code);
         return code;
       }});
  CLI::App* confined = app.add_subcommand("confined-exec", "(internal) run a command confined: the agent's Bash");
  confined->group("");
  confined->add_option("--writable", f->writable)->allow_extra_args(false);  // one path each, repeatable
  confined->add_option("--read-only", f->read_only)->allow_extra_args(false);
  confined->add_option("--hidden", f->hidden)->allow_extra_args(false);  // folders shown empty
  confined->add_option("--visible", f->visible)->allow_extra_args(false);  // the read scope (empty: everything)
  // Inside bubblewrap, which made the namespaces: only the signals are scoped.
  confined->add_flag("--signals-only", f->signals_only);
  confined->add_option("--tmpfs-bytes", f->tmpfs_bytes);     // the private /tmp's and /dev/shm's size
  confined->add_option("--max-file-bytes", f->max_file_bytes);  // RLIMIT_FSIZE
  confined->add_option("--max-disk-bytes", f->max_disk_bytes);  // what the --watch folders may hold
  confined->add_option("--watch", f->watched)->allow_extra_args(false);
  confined->add_option("--max-memory-bytes", f->max_memory_bytes);  // what the command's processes may hold
  // What they may hold of the GPU's memory outside evaluations (whose judges hold a --gpu-lock file).
  confined->add_option("--max-gpu-memory-bytes", f->max_gpu_memory_bytes);
  confined->add_option("--gpu-lock", f->gpu_locks)->allow_extra_args(false);
  confined->prefix_command();  // the first word that is not an option starts the command
  verbs.push_back({confined, [f, confined] {
                     ConfinementPlan plan;
                     plan.writable = f->writable;
                     plan.read_only = f->read_only;
                     plan.hidden = f->hidden;
                     plan.visible = f->visible;
                     plan.private_dirs = {"/tmp"};
                     plan.signals_only = f->signals_only;
                     plan.tmpfs_bytes = f->tmpfs_bytes;
                     plan.max_file_bytes = f->max_file_bytes;
                     plan.max_watched_bytes = f->max_disk_bytes;
                     plan.watched = f->watched;
                     plan.max_memory_bytes = f->max_memory_bytes;
                     plan.max_gpu_memory_bytes = f->max_gpu_memory_bytes;
                     plan.gpu_lock_files = f->gpu_locks;
                     return exec_confined(plan, confined->remaining(),
                                          f->signals_only ? std::vector<std::pair<std::string, std::string>>{}
                                                          : private_cache_env());
                   }});
}

// The first word names the command: one that names none is an error, with --help too (CLI11
// would print the main help and succeed, or say only that a command is required). 0: fine.
int reject_unknown_verb(CLI::App& app, int argc, char** argv) {
  if (argc <= 1 || argv[1][0] == '-') return 0;
  const std::string verb = argv[1];
  std::string known;
  bool found = false;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    found = found || sub->get_name() == verb;
    if (!sub->get_group().empty()) known += (known.empty() ? "" : ", ") + sub->get_name();
  }
  if (found) return 0;
  std::cerr << fmt::format("cuda-agent: unknown command '{}'. The commands: {}. See cuda-agent --help.\n", verb, known);
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  serve::register_local_policy();  // --policy local:MODEL (make_policy lives in ca_agent, below ca_serve)
  CLI::App app{"cuda-agent: train and evaluate language models that write fast CUDA kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cuda-agent 0.1.0");
  Verbs verbs;
  for (auto add : {add_single_verbs, add_bench, add_baselines, add_solve, add_eval, add_synth, add_train, add_ablate,
                   add_doctor, add_compile, add_export, add_canary, add_generate, add_serve, add_internal})
    add(app, verbs);
  if (const int rc = reject_unknown_verb(app, argc, argv)) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints the message (or the help); CLI11's own codes (105, 106, ...) become ours.
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  try {
    for (const Verb& v : verbs) {
      if (!v.cmd->parsed()) continue;
      // The process that holds rewards, results and their keys (a trainer, an eval or bench run,
      // a verify) is not dumpable: a process of the user without CAP_SYS_PTRACE (a solution, the
      // agent's commands, on a kernel without Landlock's signal scope, whose domain also keeps
      // them from ptrace) cannot read or write its memory (ptrace, process_vm_writev,
      // /proc/<pid>/mem). What it executes starts dumpable again. The internal verbs stay as they
      // are: confined-exec writes its own uid map, the judge sees to itself.
      if (!v.cmd->get_group().empty()) ::prctl(PR_SET_DUMPABLE, 0);
      return v.run();
    }
  } catch (const std::exception& e) {
    std::cerr << "cuda-agent: " << e.what() << "\n";
    return kExitUsage;
  }
  return 0;
}

#include "cuda_agent/bench/synth.h"

#include <algorithm>
#include <map>
#include <random>

#include <fmt/format.h>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/python_runtime.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
extern const char* const kSynthScript;

namespace {

// The filters in the funnel's order: a candidate is counted as dropped by the first it fails.
constexpr const char* kFilters[] = {"composed",       "runs_eager", "deterministic", "torch_compile",
                                    "not_degenerate", "eager_time", "similarity"};

// One mode of the Python side (synth_script.cpp) in a child process: `in` as its input file,
// its output file parsed. Throws Error with the child's stderr tail.
nlohmann::json run_script(const std::string& mode, const nlohmann::json& in, double timeout_s) {
  TempDir tmp("ca-synth-");
  write_file_atomic(tmp.path() / "in.json", in.dump());
  const std::string python = sandbox::python_executable();
  SubprocessOptions opts;
  opts.argv = {python, "-c", kSynthScript, mode, (tmp.path() / "in.json").string(), (tmp.path() / "out.json").string()};
  opts.stderr_path = (tmp.path() / "stderr.txt").string();
  opts.timeout_s = timeout_s;
  SubprocessResult r;
  try {
    r = run_subprocess(opts);
  } catch (const Error& e) {
    CA_FAIL("synth: cannot run {} ({}): set CUDA_AGENT_PYTHON to a Python with torch", python, e.what());
  }
  if (!r.ok() || !fs::exists(tmp.path() / "out.json")) {
    std::string err;
    try {
      err = read_file(tmp.path() / "stderr.txt");
    } catch (const Error&) {
    }
    if (err.size() > 2000) err = "..." + err.substr(err.size() - 2000);
    CA_FAIL("synth: the Python step '{}' with {} failed: the child {}:\n{}", mode, python, r.describe(), err);
  }
  return nlohmann::json::parse(read_file(tmp.path() / "out.json"));
}

nlohmann::json verdict(const nlohmann::json& passed, const std::string& detail) {
  return {{"passed", passed}, {"detail", detail}};
}

// The prompt for one LLM candidate: the template with a few catalogue ops to fuse.
std::string llm_prompt(const SynthOptions& o, const nlohmann::json& entries, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> count(2, std::max(2, o.max_ops));
  std::uniform_int_distribution<size_t> pick(0, entries.size() - 1);
  std::string ops;
  const int n = count(rng);
  for (int i = 0; i < n; ++i) ops += (i ? ", " : "") + entries[pick(rng)].at("name").get<std::string>();
  std::string p = o.llm_prompt;
  for (auto [key, value] :
       {std::pair<std::string, std::string>{"{ops}", ops}, {"{max_ops}", std::to_string(o.max_ops)}})
    for (size_t at = p.find(key); at != std::string::npos; at = p.find(key, at + value.size()))
      p.replace(at, key.size(), value);
  return p;
}

struct Candidate {
  std::string id;
  std::string code;                                   // empty when it was dropped before it had any
  nlohmann::json info = nlohmann::json::object();     // ops, seed, source
  nlohmann::json filters = nlohmann::json::object();  // name -> {passed, detail}
};

// The first filter, in the funnel's order, that the candidate failed or has not been through;
// empty when it passed them all (a filter not measured counts as passed).
std::string first_failed(const Candidate& c) {
  for (const char* f : kFilters)
    if (!c.filters.contains(f) || c.filters[f]["passed"] == false) return f;
  return "";
}

// Composes the candidates: by the sampler, by the LLM, or from an existing split.
std::vector<Candidate> compose(const SynthOptions& o, nlohmann::json& funnel, std::ostream& progress) {
  std::vector<Candidate> out;
  if (!o.from_split.empty()) {
    const Split split = load_any_split(o.from_split, o.output / "work" / "import");
    for (const TaskEntry& t : split.tasks) {
      Candidate c{t.id, read_file(t.path), {{"source", split.name}, {"extra", t.extra}}, {}};
      c.filters["composed"] = verdict(true, "from " + o.from_split.string());
      out.push_back(std::move(c));
    }
    return out;
  }
  if (!o.llm) {
    progress << fmt::format("[synth] sampling {} candidates of up to {} ops from {}\n", o.count, o.max_ops,
                            o.catalogue.string());
    // Repeats of an earlier candidate are drawn again: the similarity filter would drop them
    // after their evaluation (a fifth of 300 on the H200 before this).
    const nlohmann::json s = sample_tasks(o.catalogue, o.count, o.seed, o.max_ops, o.max_similarity);
    std::map<int, nlohmann::json> made;
    for (const auto& c : s.at("candidates")) made[c.at("index").get<int>()] = c;
    for (int i = 0; i < o.count; ++i) {
      Candidate c{fmt::format("s{}_{:04d}", o.seed, i), "", {{"source", "sampler"}}, {}};
      if (auto it = made.find(i); it != made.end()) {
        c.code = it->second.at("code");
        c.info["ops"] = it->second.at("ops");
        c.info["seed"] = it->second.at("seed");
        c.info["estimated_eager_ms"] = it->second.value("estimated_eager_ms", nlohmann::json());
        c.filters["composed"] = verdict(true, fmt::format("{} attempt(s)", it->second.at("attempts").get<int>()));
      } else {
        c.filters["composed"] = verdict(false, "no composition of the catalogue's ops ran at small sizes and differed "
                                               "from the earlier candidates (funnel.json: sampler_rejections)");
      }
      out.push_back(std::move(c));
    }
    funnel["sampler_rejections"] = s.value("rejected", nlohmann::json::object());
    return out;
  }
  const nlohmann::json catalogue = nlohmann::json::parse(read_file(o.catalogue));
  const nlohmann::json& entries = catalogue.at("entries");
  CA_CHECK(!entries.empty(), "synth: the catalogue {} has no entries", o.catalogue.string());
  CA_CHECK(!o.llm_prompt.empty(), "synth: an LLM composer needs a prompt template");
  std::mt19937_64 rng(o.seed);
  std::vector<std::string> replies;
  for (int i = 0; i < o.count; ++i) {
    Candidate c{fmt::format("l{}_{:04d}", o.seed, i), "", {{"source", o.llm_name}}, {}};
    const std::string prompt = llm_prompt(o, entries, rng);
    c.info["prompt"] = prompt;
    try {
      replies.push_back(o.llm(prompt));
    } catch (const std::exception& e) {
      replies.emplace_back();
      c.filters["composed"] = verdict(false, std::string("the policy failed: ") + e.what());
    }
    progress << fmt::format("[synth] {}/{} LLM replies\n", i + 1, o.count);
    out.push_back(std::move(c));
  }
  const nlohmann::json checked = run_script("check", {{"replies", replies}}, 600).at("results");
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].filters.contains("composed")) continue;
    const nlohmann::json& r = checked.at(i);
    if (r.value("ok", false)) {
      out[i].code = r.at("code");
      out[i].filters["composed"] =
          verdict(true, "the reply's code parses and defines Model, get_inputs, get_init_inputs");
    } else {
      out[i].filters["composed"] = verdict(false, r.value("reason", std::string("unusable reply")));
    }
  }
  return out;
}

std::string yaml_quote(const std::string& s) {
  return nlohmann::json(s).dump();
}

// Writes the candidates that have code as a split (work/candidates) with `ModelNew = Model`
// solutions beside it (work/solutions), for the bench runner.
void write_candidates(const std::vector<Candidate>& cands, const fs::path& work) {
  std::string yaml = "name: synth-candidates\ntasks:\n";
  for (const Candidate& c : cands) {
    if (c.code.empty()) continue;
    const fs::path dir = work / "candidates" / "tasks" / c.id;
    fs::create_directories(dir);
    write_file_atomic(dir / "model.py", c.code);
    fs::create_directories(work / "solutions" / c.id);
    write_file_atomic(work / "solutions" / c.id / "model_new.py", c.code + "\n\nModelNew = Model\n");
    yaml += fmt::format("  - id: {}\n    path: tasks/{}/model.py\n", c.id, c.id);
  }
  write_file_atomic(work / "candidates" / "split.yaml", yaml);
}

}  // namespace

nlohmann::json synth_filters(const nlohmann::json& r, double min_eager_ms, double max_eager_ms, bool shared_gpu) {
  nlohmann::json f = nlohmann::json::object();
  const std::string category =
      r.value("category", nlohmann::json()).is_string() ? r["category"].get<std::string>() : "";
  const std::string message = r.value("message", std::string()).substr(0, 300);
  const bool gpu = r.value("mode", std::string()) != "verify";
  // The same code on both sides: a difference between them, or between its two runs, is the
  // task's nondeterminism.
  const nlohmann::json& check = r.value("task_check", nlohmann::json());
  if (category == "mismatch" || category == "nondeterministic" || category == "precision" ||
      category == "timing_mismatch") {
    f["runs_eager"] = verdict(true, "ran");
    if (check.is_object() && check.value("nan_output", false)) {
      // NaN in the reference's output never matches, itself included: the task, not its
      // determinism, is what failed.
      f["deterministic"] = verdict(nullptr, "not judged: the reference's output holds NaN (" + category + ")");
      f["torch_compile"] = verdict(nullptr, "not judged: the reference's output holds NaN");
      f["not_degenerate"] = verdict(false, "the task check: " + check.dump());
      return f;
    }
    f["deterministic"] = verdict(false, category + ": " + message);
    return f;
  }
  if (!category.empty()) {
    f["runs_eager"] = verdict(false, category + ": " + message);
    return f;
  }
  f["runs_eager"] = verdict(true, "ran");
  f["deterministic"] = verdict(true, "two runs on the same inputs agree");
  const nlohmann::json& t = r.value("timings", nlohmann::json());
  if (!gpu || !t.is_object()) {
    f["torch_compile"] = verdict(nullptr, "not measured (a verify-only evaluation: no GPU)");
  } else if (t.value("compile", nlohmann::json()).is_object()) {
    f["torch_compile"] = verdict(true, fmt::format("{:.3f} ms", t["compile"].value("median_ms", 0.0)));
  } else {
    const nlohmann::json& err = t.value("compile_error", nlohmann::json());
    f["torch_compile"] =
        verdict(false, err.is_string() ? err.get<std::string>().substr(0, 300) : "torch.compile was not timed");
    return f;
  }
  if (check.is_object() && check.value("degenerate", false))
    f["not_degenerate"] = verdict(false, "the task check: " + check.dump());
  else
    f["not_degenerate"] = verdict(check.is_object() ? nlohmann::json(true) : nlohmann::json(nullptr),
                                  check.is_object() ? "outputs vary with the inputs" : "no task check in the result");
  if (f["not_degenerate"]["passed"] == false) return f;
  if (!gpu || !t.is_object() || !t.value("eager", nlohmann::json()).is_object()) {
    f["eager_time"] = verdict(nullptr, "not measured (no GPU timing)");
  } else {
    const nlohmann::json& eager = t["eager"];
    const bool kernels = shared_gpu && eager.value("gpu_kernel_ms", nlohmann::json()).is_number();
    const double ms = kernels ? eager["gpu_kernel_ms"].get<double>() : eager.value("median_ms", 0.0);
    const bool in = ms >= min_eager_ms && ms <= max_eager_ms;
    f["eager_time"] = verdict(in, fmt::format("eager {:.3f} ms ({}), window [{}, {}] ms", ms,
                                              kernels       ? "GPU kernel time, the GPU shared"
                                              : shared_gpu ? "interval, the GPU shared"
                                                           : "interval",
                                              min_eager_ms, max_eager_ms));
  }
  return f;
}

nlohmann::json sample_tasks(const fs::path& catalogue, int count, uint64_t seed, int max_ops, double max_similarity) {
  return run_script("sample",
                    {{"catalogue", fs::absolute(catalogue).string()},
                     {"count", count},
                     {"seed", seed},
                     {"max_ops", max_ops},
                     {"max_similarity", max_similarity}},
                    3600);
}

nlohmann::json similarity_filter(const std::vector<std::string>& references,
                                 const std::vector<std::pair<std::string, fs::path>>& candidates, double threshold) {
  nlohmann::json in = {{"references", references}, {"candidates", nlohmann::json::array()}, {"threshold", threshold}};
  for (const auto& [id, path] : candidates) in["candidates"].push_back({{"id", id}, {"path", path.string()}});
  return run_script("similarity", in, 1800);
}

double ast_similarity(const std::string& code_a, const std::string& code_b) {
  TempDir tmp("ca-synth-sim-");
  write_file_atomic(tmp.path() / "a.py", code_a);
  write_file_atomic(tmp.path() / "b.py", code_b);
  const nlohmann::json r = similarity_filter({(tmp.path() / "a.py").string()}, {{"b", tmp.path() / "b.py"}}, 2.0);
  const nlohmann::json& b = r.at("results").at(0);
  CA_CHECK(!b.contains("error") && !b.at("reference_max").is_null(), "ast_similarity: the code does not parse");
  return b.at("reference_max").get<double>();
}

void refresh_catalogue(const fs::path& out) {
  const nlohmann::json cat = run_script("catalogue", nlohmann::json::object(), 1800);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  write_file_atomic(out, cat.dump(1) + "\n");
}

nlohmann::json run_synth(const SynthOptions& o, std::ostream& progress) {
  CA_CHECK(!o.output.empty(), "synth: no output folder (--output)");
  CA_CHECK(o.min_eager_ms >= 0 && o.max_eager_ms > o.min_eager_ms, "synth: the eager time window [{}, {}] ms is empty",
           o.min_eager_ms, o.max_eager_ms);
  CA_CHECK(o.max_similarity > 0 && o.max_similarity <= 1, "synth: --max-similarity {} must be in (0, 1]",
           o.max_similarity);
  if (o.from_split.empty()) {
    CA_CHECK(fs::is_regular_file(o.catalogue),
             "synth: no op catalogue at {}: pass --catalogue, or make one with "
             "cuda-agent synth --refresh-catalogue {}",
             o.catalogue.string(), o.catalogue.string());
    CA_CHECK(o.max_ops >= 1 && o.max_ops <= 5, "synth: --max-ops {} is out of range: use 1 to 5", o.max_ops);
    CA_CHECK(o.count >= 1, "synth: --count {} must be at least 1", o.count);
  }
  std::vector<std::string> references;
  if (!o.kernelbench.empty()) {
    for (const TaskEntry& t : load_kernelbench_dir(o.kernelbench).tasks) references.push_back(t.path.string());
  }
  // A folder that holds something else (a split of the user's own, say) is not overwritten.
  CA_CHECK(!fs::exists(o.output) || fs::is_empty(o.output) || fs::exists(o.output / "funnel.json") ||
               fs::exists(o.output / "work"),
           "synth: the output folder {} exists and is not an earlier synth run's: choose a new folder",
           o.output.string());
  const fs::path work = o.output / "work";
  fs::create_directories(work);
  nlohmann::json funnel = {{"device", o.bench.device},
                           {"seed", o.seed},
                           {"max_ops", o.max_ops},
                           {"eager_window_ms", {o.min_eager_ms, o.max_eager_ms}},
                           {"max_similarity", o.max_similarity},
                           {"timing", o.bench.device == "cpu" ? std::string("none (no GPU)")
                                      : o.exclusive_timing    ? std::string("exclusive (the GPU lock)")
                                                              : fmt::format("shared: {} evaluations at once per GPU",
                                                                            o.bench.workers_per_gpu)},
                           {"kernelbench_tasks", references.size()},
                           {"composer", !o.from_split.empty() ? "split:" + o.from_split.string()
                                        : o.llm               ? o.llm_name
                                                              : std::string("sampler")}};
  std::vector<Candidate> cands = compose(o, funnel, progress);

  // The sandbox: each candidate evaluated as its own solution (ModelNew = Model), with few runs.
  write_candidates(cands, work);
  BenchOptions b = o.bench;
  b.split = work / "candidates";
  b.solutions = work / "solutions";
  b.output_dir = work / "bench";
  b.mode = b.device == "cpu" ? sandbox::EvalMode::kVerify : sandbox::EvalMode::kEvaluate;
  b.gpu_lock = o.exclusive_timing;
  b.baselines_first = false;  // each candidate is its own solution: one judge times both sides
  b.sandbox.fallback = "off";
  b.sandbox.provenance = "off";
  b.sandbox.trials = std::min(b.sandbox.trials, 3);
  b.sandbox.timed_runs = std::min(b.sandbox.timed_runs, 5);
  b.sandbox.warmup_runs = std::min(b.sandbox.warmup_runs, 2);
  b.sandbox.warmup_ms = std::min(b.sandbox.warmup_ms, 20.0);
  std::map<std::string, nlohmann::json> results;
  if (std::any_of(cands.begin(), cands.end(), [](const Candidate& c) { return !c.code.empty(); })) {
    const nlohmann::json bench = run_bench(b, progress);
    for (const auto& r : bench.at("results")) results[r.value("task_id", std::string())] = r;
  }
  for (Candidate& c : cands) {
    if (c.code.empty()) continue;
    auto it = results.find(c.id);
    if (it == results.end()) {
      c.filters["runs_eager"] = verdict(false, "no evaluation result");
      continue;
    }
    c.filters.update(synth_filters(it->second, o.min_eager_ms, o.max_eager_ms, !o.exclusive_timing));
    if (it->second.contains("timings")) c.info["timings"] = it->second["timings"];
  }

  // Similarity last, in the candidates' order: to KernelBench and to those accepted before.
  std::vector<std::pair<std::string, fs::path>> sim_in;
  for (const Candidate& c : cands)
    if (first_failed(c) == "similarity")  // every filter before it passed
      sim_in.emplace_back(c.id, work / "candidates" / "tasks" / c.id / "model.py");
  std::map<std::string, nlohmann::json> sims;
  if (!sim_in.empty()) {
    const nlohmann::json sim_out = similarity_filter(references, sim_in, o.max_similarity);
    write_file_atomic(work / "similarity.json", sim_out.dump(1) + "\n");
    for (const auto& r : sim_out.at("results")) sims[r.at("id").get<std::string>()] = r;
  }
  for (Candidate& c : cands) {
    auto it = sims.find(c.id);
    if (it == sims.end()) continue;
    const nlohmann::json& s = it->second;
    auto fmt_max = [](const nlohmann::json& v) { return v.is_number() ? fmt::format("{:.3f}", v.get<double>()) : "-"; };
    c.filters["similarity"] =
        verdict(s.value("accepted", false),
                fmt::format("max {} to KernelBench ({}), max {} to accepted tasks ({})", fmt_max(s["reference_max"]),
                            s["reference_nearest"].is_string()
                                ? fs::path(s["reference_nearest"].get<std::string>()).filename().string()
                                : "-",
                            fmt_max(s["accepted_max"]),
                            s["accepted_nearest"].is_string() ? s["accepted_nearest"].get<std::string>() : "-"));
  }

  // The funnel, the accepted split, and every candidate's record.
  nlohmann::json dropped = nlohmann::json::object();
  for (const char* f : kFilters) dropped[f] = 0;
  nlohmann::json records = nlohmann::json::array();
  std::vector<const Candidate*> accepted;
  for (const Candidate& c : cands) {
    const std::string failed = first_failed(c);
    if (failed.empty())
      accepted.push_back(&c);
    else
      dropped[failed] = dropped[failed].get<int>() + 1;
    records.push_back({{"id", c.id},
                       {"accepted", failed.empty()},
                       {"dropped_by", failed.empty() ? nlohmann::json() : nlohmann::json(failed)},
                       {"filters", c.filters},
                       {"info", c.info}});
  }
  const fs::path tasks_dir = o.output / "tasks";
  fs::remove_all(tasks_dir);
  std::string yaml = fmt::format(
      "name: {}\ndescription: {}\ntasks:\n", yaml_quote(o.output.filename().string()),
      yaml_quote(fmt::format("cuda-agent synth, composer {}, seed {}", funnel["composer"].get<std::string>(), o.seed)));
  for (const Candidate* c : accepted) {
    fs::create_directories(tasks_dir / c->id);
    write_file_atomic(tasks_dir / c->id / "model.py", c->code);
    nlohmann::json sidecar = {{"level", 2}, {"synth", {{"info", c->info}, {"filters", c->filters}}}};
    write_file_atomic(tasks_dir / c->id / "task.yaml", sidecar.dump(1) + "\n");  // JSON is YAML
    nlohmann::json extra = {{"synth_source", c->info.value("source", std::string())}};
    if (c->info.contains("ops")) extra["ops"] = c->info["ops"];
    yaml += fmt::format("  - id: {}\n    path: tasks/{}/model.py\n    level: 2\n    extra: {}\n", c->id, c->id,
                        extra.dump());
  }
  write_file_atomic(o.output / "split.yaml", yaml);
  funnel["candidates"] = cands.size();
  funnel["dropped"] = dropped;
  funnel["accepted"] = accepted.size();
  write_file_atomic(work / "candidates.json", records.dump(1) + "\n");
  write_file_atomic(o.output / "funnel.json", funnel.dump(1) + "\n");
  std::string md = fmt::format("# synth funnel ({})\n\n| stage | dropped | left |\n|---|---|---|\n",
                               funnel["composer"].get<std::string>());
  size_t left = cands.size();
  md += fmt::format("| candidates | | {} |\n", left);
  for (const char* f : kFilters) {
    left -= dropped[f].get<int>();
    md += fmt::format("| {} | {} | {} |\n", f, dropped[f].get<int>(), left);
  }
  md += fmt::format("\nAccepted: {} of {} ({}). Per-candidate records: work/candidates.json.\n", accepted.size(),
                    cands.size(), o.bench.device == "cpu" ? "CPU: torch_compile and eager_time not measured" : "GPU");
  write_file_atomic(o.output / "funnel.md", md);
  progress << md;
  return funnel;
}

}  // namespace cuda_agent::bench

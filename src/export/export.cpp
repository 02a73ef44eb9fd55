#include "cuda_agent/export/export.h"

#include <ctime>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/kernel_signature.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "embedded_files.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace cuda_agent::exporter {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// A string field of a report, "" where it is missing or not a string.
std::string string_field(const json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// An integer field of a report (a version), 0 where it is missing or not a number.
int64_t integer_field(const json& report, const char* key) {
  const auto it = report.find(key);
  return it != report.end() && it->is_number() ? it->get<int64_t>() : 0;
}

json read_json(const fs::path& path, const char* what) {
  CA_CHECK(fs::is_regular_file(path), "{} {}: no such file", what, path.string());
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    CA_FAIL("{} {} is not JSON ({}): give the result JSON an evaluation wrote (evaluate --output, a bench's "
            "results/<id>.json)", what, path.string(), e.what());
  }
}

fs::path model_file(const fs::path& given, const char* name) {
  return fs::is_directory(given) ? given / name : given;
}

json param_json(const sandbox::KernelParam& p) {
  return {{"type", p.type_text}, {"pointer", p.is_pointer}, {"kind", sandbox::scalar_kind_name(p.kind)},
          {"vector_width", p.vector_width}};
}

json kernel_json(const std::string& symbol, const sandbox::KernelSignature& sig) {
  json params = json::array();
  for (const auto& p : sig.params) params.push_back(param_json(p));
  return {{"symbol", symbol}, {"params", params}};
}

// Imports the solution in a plain Python with a recording cuda_agent: the programs it compiles
// at import, the task's inputs and init inputs described.
json record_solution(const fs::path& package, const fs::path& task, const fs::path& solution, double timeout_s) {
  TempDir scratch("cuda-agent-export-");
  const fs::path script = scratch.path() / "record.py", out = scratch.path() / "record.json",
                 log = scratch.path() / "record.log";
  write_file_atomic(script, kRecordScript);
  SubprocessOptions o;
  o.argv = {sandbox::python_executable(), "-B", script.string(), package.string(), task.string(), solution.string(),
            out.string()};
  o.stdout_path = o.stderr_path = log.string();
  o.timeout_s = timeout_s;
  o.env_set = {{"CUDA_VISIBLE_DEVICES", ""}};  // the import compiles nothing and launches nothing
  const SubprocessResult r = run_subprocess(o);
  CA_CHECK(r.ok() && fs::is_regular_file(out),
           "importing {} to record what it compiles {} (python {}):\n{}", solution.string(), r.describe(),
           o.argv[0], tail_text(read_file(log), 4000));
  return json::parse(read_file(out));
}

// Compiles one recorded program for `arch`; writes kernels/<digest>.cu and .cubin.
json compile_program(const json& recorded, const std::string& arch, const fs::path& package) {
  const std::string source = recorded.at("source");
  const std::string digest = recorded.at("digest");
  sandbox::CompileOptions options;
  options.arch = recorded.value("arch", "").empty() ? arch : recorded.at("arch").get<std::string>();
  options.options = recorded.at("options").get<std::vector<std::string>>();
  options.name_expressions = recorded.at("name_expressions").get<std::vector<std::string>>();
  sandbox::NvrtcCompiler compiler;
  const sandbox::CompiledProgram program = compiler.compile(source, options);
  CA_CHECK(program.ok, "a program of the solution does not compile for {} (it did when it was scored?):\n{}",
           options.arch, tail_text(program.error_report(), 6000));
  json kernels = json::object();
  for (const auto& sig : sandbox::parse_extern_c_kernels(source)) kernels[sig.name] = kernel_json(sig.name, sig);
  for (const auto& [expression, lowered] : program.lowered_names)
    kernels[expression] = kernel_json(lowered, sandbox::signature_from_lowered_name(lowered));
  const std::string stem = "kernels/" + digest.substr(0, 24);
  write_file_atomic(package / (stem + ".cu"), source);
  write_file_atomic(package / (stem + ".cubin"), program.cubin);
  return {{"source", stem + ".cu"},
          {"cubin", stem + ".cubin"},
          {"cubin_sha256", sha256_hex(program.cubin)},
          {"cubin_bytes", program.cubin.size()},
          {"arch", options.arch},
          {"options", options.options},
          {"name_expressions", options.name_expressions},
          {"nvrtc_options", program.effective_options},
          {"kernels", kernels}};
}

std::string package_readme(const std::string& name, const sandbox::EvalResult& result, const std::string& arch) {
  // A verify-only evaluation has no reward (nothing was timed).
  const std::string reward = result.reward ? fmt::format("reward {}", *result.reward) : "verified, not timed";
  return fmt::format(
      "# {0}\n\nExported by `cuda-agent export` from {1} ({2}, on {3}).\n\n"
      "```python\nimport {0}\nmodel = {0}.Model(*init_inputs).cuda()   # in place of the task's Model\n"
      "y = model(*inputs)\nprint({0}.stats())   # kernel calls and fallbacks by reason\n```\n\n"
      "Calls that differ from what was verified (input shapes or dtypes, GPU architecture, torch version,\n"
      "non-contiguous or unaligned tensors) run the fallback: the task's reference under {4}.\n"
      "Check the package on the target machine with `python -m {0}.canary` (or `cuda-agent canary`).\n"
      "manifest.json lists every file's sha256; audit.json holds the evaluation that scored it.\n",
      name, result.task_id.empty() ? std::string("the task") : result.task_id, reward, arch,
      "torch.compile (or eager, as exported)");
}

}  // namespace

ExportSummary export_solution(const ExportOptions& options) {
  CA_CHECK(options.fallback == "compile" || options.fallback == "eager",
           "--fallback '{}' is unknown: use compile (the reference under torch.compile) or eager", options.fallback);
  const json result = read_json(options.result, "--result");
  // Read through the sandbox's own schema: a field an evaluation leaves null (a verify-only
  // result has no reward or speedups) is absent, not an error.
  sandbox::EvalResult scored;
  try {
    scored = sandbox::EvalResult::from_json(result);
  } catch (const std::exception& e) {
    CA_FAIL("--result {} is not an evaluation result ({}): give the JSON an evaluation wrote (evaluate --output, a "
            "bench's results/<id>.json)", options.result.string(), e.what());
  }
  CA_CHECK(scored.ok && scored.correct.value_or(false),
           "--result {}: the solution did not pass its evaluation ({}: {}); export only what was verified",
           options.result.string(), sandbox::to_string(scored.category), scored.message);
  const auto report = [&](const char* key) {
    const auto it = scored.reports.find(key);
    return it != scored.reports.end() && it->is_object() ? *it : json::object();
  };
  const json device = report("device");
  const std::string arch = string_field(device, "arch");
  CA_CHECK(!arch.empty(),
           "--result {}: no GPU in the result (verified with --device cpu?); export needs an evaluation on the GPU it "
           "is for (cuda-agent evaluate --output R.json)", options.result.string());

  // load_inline builds a shared library with nvcc when the solution is imported: no cubin to
  // ship, and a compiler needed wherever it runs.
  CA_CHECK(scored.build_path != "nvcc",
           "--result {}: the solution builds its kernels with load_inline (nvcc) at import; export ships kernels "
           "compiled through cuda_agent.compile (build path nvrtc), vendor calls and torch code. Port its kernels to "
           "cuda_agent.compile, evaluate it again, then export", options.result.string());
  const fs::path solution = fs::absolute(
      model_file(options.solution.empty() ? fs::path(scored.solution_path) : options.solution, "model_new.py"));
  const fs::path task =
      fs::absolute(model_file(options.task.empty() ? fs::path(scored.task_path) : options.task, "model.py"));
  CA_CHECK(fs::is_regular_file(solution), "the solution {} does not exist (give --solution)", solution.string());
  CA_CHECK(fs::is_regular_file(task), "the task {} does not exist (give --task)", task.string());
  const std::string solution_sha = sandbox::solution_fingerprint(solution.string());  // its folder too
  CA_CHECK(!solution_sha.empty() && solution_sha == scored.solution_sha256,
           "{} or a file beside it changed since {} scored it (fingerprint {}, scored {}): evaluate it again, then "
           "export",
           solution.string(), options.result.string(), solution_sha.substr(0, 16),
           scored.solution_sha256.empty() ? std::string("none") : scored.solution_sha256.substr(0, 16));
  const std::string task_sha = file_sha256(task);
  if (!scored.task_sha256.empty())
    CA_CHECK(task_sha == scored.task_sha256, "{} is not the task {} scored against (sha256 {}, scored {})",
             task.string(), options.result.string(), task_sha.substr(0, 16), scored.task_sha256.substr(0, 16));

  const fs::path output = fs::absolute(options.output).lexically_normal();
  const std::string name = (output.has_filename() ? output : output.parent_path()).filename().string();
  static const std::regex identifier("[A-Za-z_][A-Za-z0-9_]*");
  CA_CHECK(std::regex_match(name, identifier) && name != "cuda_agent" && name != "torch",
           "--output {}: its last folder '{}' is the package's import name and must be a Python identifier "
           "(letters, digits, _) other than cuda_agent and torch", options.output.string(), name);
  CA_CHECK(!fs::exists(output) || options.force, "--output {} exists; choose another folder or pass --force",
           output.string());
  fs::create_directories(output.parent_path());

  // Built in a sibling folder, then renamed: a failed export leaves nothing half-written.
  TempDir building("." + name + "-export-", output.parent_path());
  const fs::path pkg = building.path();
  for (const auto& [file, content] : kPackageFiles) write_file_atomic(pkg / file, content);
  write_file_atomic(pkg / "solution.py", read_file(solution));
  write_file_atomic(pkg / "reference.py", read_file(task));

  const json recorded = record_solution(pkg, task, solution, options.timeout_s);
  json programs = json::object();
  int kernels = 0;
  for (const json& program : recorded.at("programs")) {
    const std::string digest = program.at("digest");
    if (programs.contains(digest)) continue;
    fs::create_directories(pkg / "kernels");
    programs[digest] = compile_program(program, arch, pkg);
    kernels += static_cast<int>(programs[digest]["kernels"].size());
  }

  const json versions = report("versions");
  json audit = {{"exported_at", utc_now()},
                {"exported_by", fmt::format("cuda-agent {}", CUDA_AGENT_VERSION)},
                {"result_file", fs::absolute(options.result).string()},
                {"task", {{"id", scored.task_id}, {"path", task.string()}, {"sha256", task_sha}}},
                {"solution", {{"path", solution.string()}, {"sha256", solution_sha}}},
                {"scored_by", {{"result_schema", result.value("schema_version", json())},
                               {"mode", scored.mode},
                               {"reward_kind", scored.reward_kind},
                               {"precision", scored.precision}}},
                {"result", result}};
  write_file_atomic(pkg / "audit.json", audit.dump(2) + "\n");
  write_file_atomic(pkg / "README.md", package_readme(name, scored, arch));
  write_file_atomic(pkg / "state.json", json({{"mode", "kernel"}}).dump(2) + "\n");

  json files = json::object();
  for (const auto& entry : fs::recursive_directory_iterator(pkg)) {
    if (!entry.is_regular_file()) continue;
    const std::string rel = fs::relative(entry.path(), pkg).string();
    if (rel == "state.json" || rel.find("__pycache__") != std::string::npos) continue;
    files[rel] = file_sha256(entry.path());
  }
  json manifest = {{"format", 1},
                   {"name", name},
                   {"fallback", options.fallback},
                   {"verified",
                    {{"arch", arch},
                     {"gpu", string_field(device, "name")},
                     {"torch", string_field(versions, "torch")},
                     {"nvrtc", integer_field(versions, "nvrtc")},
                     {"cuda_driver", integer_field(versions, "cuda_driver")}}},
                   {"inputs", recorded.at("inputs")},
                   {"init_inputs", recorded.at("init_inputs")},
                   {"programs", programs},
                   {"files", files}};
  write_file_atomic(pkg / "manifest.json", manifest.dump(2) + "\n");

  if (fs::exists(output)) fs::remove_all(output);
  fs::rename(pkg, output);
  building.keep();  // renamed away: nothing left to remove
  // TempDir made it 0700; a package is read by whoever imports it.
  fs::permissions(output, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);

  ExportSummary summary;
  summary.package = output;
  summary.name = name;
  summary.programs = static_cast<int>(programs.size());
  summary.kernels = kernels;
  summary.arch = arch;
  summary.manifest_sha256 = manifest_sha256(output);
  return summary;
}

std::string manifest_sha256(const fs::path& package) {
  const std::string sha = file_sha256(package / "manifest.json");
  CA_CHECK(!sha.empty(), "{}: no manifest.json; is it a folder cuda-agent export wrote?", package.string());
  return sha;
}

std::string package_differences(const fs::path& package) {
  const json manifest = read_json(package / "manifest.json", "the package's manifest");
  CA_CHECK(manifest.contains("files") && manifest["files"].is_object(),
           "{}: its manifest lists no files; export the solution again", package.string());
  for (const auto& [rel, digest] : manifest["files"].items()) {
    const std::string actual = file_sha256(package / rel);
    if (actual.empty()) return fmt::format("{} is missing or unreadable", rel);
    if (actual != digest.get<std::string>())
      return fmt::format("{} differs from the manifest (sha256 {}, exported {}): the package was changed after export",
                         rel, actual.substr(0, 16), digest.get<std::string>().substr(0, 16));
  }
  // Python files the manifest does not list would be imported beside the package's own.
  for (const auto& entry : fs::recursive_directory_iterator(package)) {
    const std::string rel = fs::relative(entry.path(), package).string();
    if (entry.is_regular_file() && entry.path().extension() == ".py" && !manifest["files"].contains(rel))
      return fmt::format("{} is not part of the export", rel);
  }
  return "";
}

void roll_back(const fs::path& package, const std::string& reason) {
  write_file_atomic(package / "state.json",
                    json({{"mode", "fallback"}, {"reason", reason}, {"at", utc_now()}}).dump(2) + "\n");
}

CanaryOutcome run_canary(const CanaryOptions& options) {
  const fs::path package = fs::absolute(options.package).lexically_normal();
  CanaryOutcome outcome;
  auto fail = [&](const std::string& problem) {
    outcome.problem = problem;
    if (options.rollback) {
      roll_back(package, problem);
      outcome.rolled_back = true;
    }
    return outcome;
  };
  const std::string sha = manifest_sha256(package);
  if (!options.expect_manifest.empty() && sha != options.expect_manifest)
    return fail(fmt::format("manifest.json is not the exported one (sha256 {}, expected {})", sha, options.expect_manifest));
  if (const std::string diff = package_differences(package); !diff.empty()) return fail(diff);

  TempDir scratch("cuda-agent-canary-");
  const fs::path log = scratch.path() / "canary.log";
  const fs::path out = scratch.path() / "report.json";
  SubprocessOptions o;
  o.argv = {sandbox::python_executable(), "-B", "-m", package.filename().string() + ".canary", "--report", out.string(),
            "--trials", std::to_string(options.trials), "--runs", std::to_string(options.runs),
            fmt::format("--margin={}", options.margin)};
  o.env_set = {{"PYTHONPATH", package.parent_path().string()}};
  o.cwd = package.parent_path().string();
  o.stdout_path = o.stderr_path = log.string();
  o.timeout_s = options.timeout_s;
  const SubprocessResult r = run_subprocess(o);
  if (fs::is_regular_file(out)) {
    try {
      outcome.report = json::parse(read_file(out));
    } catch (const json::exception&) {
    }
  }
  if (!outcome.report.is_object())
    return fail(fmt::format("the package's canary {} without a report:\n{}", r.describe(),
                            tail_text(read_file(log), 4000)));
  if (!outcome.report.value("ok", false)) return fail(outcome.report.value("problem", std::string("no reason given")));
  outcome.ok = true;
  return outcome;
}

}  // namespace cuda_agent::exporter

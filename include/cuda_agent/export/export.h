// Shipping a kernel: `cuda-agent export` turns an evaluated solution into a Python package that
// needs torch and nothing of cuda-agent, and `cuda-agent canary` checks such a package on the
// machine it is to run on.
//
// The package (docs/export.md): `import <name>; <name>.Model(...)` replaces the task's Model. Its
// kernels are the solution's NVRTC programs compiled to cubin for the architecture the
// evaluation ran on, launched through the CUDA driver; a guard sends any call that does not look
// like what the sandbox verified (input shapes, dtypes, device architecture, contiguity and
// alignment, torch version) to the fallback (the task's reference under torch.compile, or
// eager), and counts it. manifest.json holds every file's sha256; audit.json what scored it.
//
// Failure: bad input (a result that did not pass, a solution changed since it was scored, an
// output folder that exists) throws Error naming the file and what to do. Not thread-safe
// beyond what run_subprocess is.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::exporter {

struct ExportOptions {
  std::filesystem::path result;    // the evaluation's result JSON (evaluate --output, a bench's results/<id>.json)
  std::filesystem::path solution;  // empty: the result's solution_path
  std::filesystem::path task;      // empty: the result's task_path
  std::filesystem::path output;    // the package folder to create (its last component is the import name)
  std::string fallback = "compile";  // "compile" (the reference under torch.compile) or "eager"
  bool force = false;              // replace an existing package folder
  double timeout_s = 300;          // for importing the solution to record what it compiles
};

struct ExportSummary {
  std::filesystem::path package;
  std::string name;                // the import name
  int programs = 0;                // NVRTC programs compiled
  int kernels = 0;                 // kernels the manifest types
  std::string arch;                // what the cubins are for
  std::string manifest_sha256;     // pin this for canary --expect-manifest
};

// Builds the package. Throws Error on bad input (see above) and when a program does not compile.
ExportSummary export_solution(const ExportOptions& options);

// Every file the manifest lists against its sha256; "" when all agree, else the first
// difference in words. Throws Error when the folder holds no readable manifest.
std::string package_differences(const std::filesystem::path& package);

// sha256 of the package's manifest.json.
std::string manifest_sha256(const std::filesystem::path& package);

struct CanaryOptions {
  std::filesystem::path package;
  int trials = 5;
  int runs = 30;
  double margin = 0.05;
  bool rollback = false;
  std::string expect_manifest;  // the manifest's sha256 as export printed it; empty: not checked
  double timeout_s = 1800;
};

struct CanaryOutcome {
  bool ok = false;
  std::string problem;   // why not, when !ok
  bool rolled_back = false;
  nlohmann::json report;  // the package's canary report, when it ran
};

// Checks the files (and the pinned manifest), then runs the package's canary in a plain Python
// (python -m <name>.canary): fresh inputs against the reference, timed against the fallback.
// On failure with rollback set, state.json switches the package to its fallback.
CanaryOutcome run_canary(const CanaryOptions& options);

// Writes state.json: {"mode": "fallback", "reason": ..., "at": ...}.
void roll_back(const std::filesystem::path& package, const std::string& reason);

}  // namespace cuda_agent::exporter

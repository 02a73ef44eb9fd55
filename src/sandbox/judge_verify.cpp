// verify, on the judge's side: the seeded trials. Each trial's inputs are drawn right before it;
// the reference's outputs stay in the judge; the candidate's come back through the output block
// and are compared here under the precision policy.
#include <fmt/format.h>
#include <pybind11/embed.h>

#include "cuda_agent/sandbox/task_check.h"
#include "cuda_agent/sandbox/task_runner.h"
#include "evaluation_support.h"
#include "judge.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {

void judge_verify(Judge& j) {
  const SandboxOptions& opt = j.opt;
  const bool checks = opt.integrity_checks;
  nlohmann::json trials = nlohmann::json::array();
  nlohmann::json fallback = {{"mode", opt.fallback}, {"compute_calls", nlohmann::json::object()}, {"allowed_calls", 0}};
  TaskCheck task_check(opt.atol, opt.rtol);
  Laps laps;  // what the verify phase, in the GPU's exclusive lock, is made of (reports.verify_seconds)
  auto record = [&] {
    j.result.reports["verify_seconds"] = laps.to_json();
    j.result.reports["verify"] = {{"trials", trials}, {"atol", opt.atol}, {"rtol", opt.rtol}, {"precision", opt.precision}};
    j.result.reports["task_check"] = task_check.to_json();
    j.result.reports["fallback"] = fallback;
    if (j.gpu && opt.provenance != "off") j.result.reports["provenance"] = j.provenance.to_json();
  };
  try {
    for (int i = 0; i < opt.trials; ++i) {
      const int64_t seed = j.input_seed(i);
      const std::string where = fmt::format("trial {} (seed {})", i, seed);
      py::object inputs, ref, ref64;
      guarded(Category::kTaskError, where + ": drawing inputs", [&] { inputs = draw_inputs(j.task, j.device, seed); });
      laps.lap("inputs");
      guarded(Category::kTaskError, where + ": running the reference", [&] {
        std::string view;
        j.reference_outputs(inputs, &ref, &view);
        laps.lap("reference");
        ref64 = j.float64_outputs(inputs);
        synchronize(j.device);
        j.release_cached();
        laps.lap("reference64");
        task_check.add(ref, inputs);
        task_check.note_view_of_input(view);
        j.reserve_outputs(ref);
      });
      laps.lap("task_check");
      const RunFlags flags{/*guard=*/true, /*poison=*/checks, /*full_checks=*/checks};
      CandidateRun run = j.run_candidate(inputs, flags, where);
      laps.lap("candidate");
      if (run.reply.contains("fallback") && run.reply["fallback"].is_object()) fallback = run.reply["fallback"];
      CompareResult cmp;
      guarded(Category::kRuntimeError, where + ": comparing outputs", [&] { cmp = j.compare(ref, ref64, run.outputs); });
      ref = ref64 = py::none();
      j.release_cached();
      laps.lap("compare");
      nlohmann::json t = cmp.to_json();
      t["seed"] = seed;
      trials.push_back(t);
      if (!cmp.ok)
        throw Failure{cmp.precision_failure ? Category::kPrecision : Category::kMismatch,
                      fmt::format("{}: {}: {}", where, cmp.path, cmp.reason)};
      if (checks && i == 0) {
        // The same inputs again, on freshly poisoned memory: races, uninitialised or
        // out-of-bounds reads and random output show up as a difference beyond tolerance.
        py::object first = clone_tree(run.outputs);
        CandidateRun again = j.run_candidate(inputs, flags, where + ", second run on the same inputs");
        CompareResult same;
        guarded(Category::kRuntimeError, where + ": comparing the two runs",
                [&] { same = compare_outputs(first, again.outputs, opt.atol, opt.rtol); });
        first = py::none();
        j.release_cached();
        laps.lap("second_run");
        if (!same.ok)
          throw Failure{Category::kNondeterministic,
                        fmt::format("{}: two runs on the same inputs disagree beyond atol/rtol ({}: {}); a race, an "
                                    "uninitialised or out-of-bounds read, or random output",
                                    where, same.path, same.reason)};
      }
    }
  } catch (const Failure&) {
    record();
    throw;
  }
  record();
  j.result.correct = true;
}

}  // namespace cuda_agent::sandbox

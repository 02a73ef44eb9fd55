// The memory plan, on the judge's side: one input set drawn and the reference (and, under
// strict, the float64 reference) run on it under torch's peak counters, before the solution is
// loaded; then the plan (memory_plan.h) and, at the end, the evaluation's peaks.
#include <fmt/format.h>
#include <pybind11/embed.h>

#include "cuda_agent/sandbox/task_runner.h"
#include "cuda_agent/sandbox/tensor_exchange.h"
#include "evaluation_support.h"
#include "judge.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

int64_t module_bytes(py::handle model) {
  if (!model || model.is_none()) return 0;
  return tree_tensor_bytes(py::list(model.attr("parameters")())) + tree_tensor_bytes(py::list(model.attr("buffers")()));
}

struct CudaMemory {
  py::object cuda = py::module_::import("torch").attr("cuda");
  int64_t allocated() const { return cuda.attr("memory_allocated")().cast<int64_t>(); }
  int64_t peak() const { return cuda.attr("max_memory_allocated")().cast<int64_t>(); }
  void reset_peak() const { cuda.attr("reset_peak_memory_stats")(); }
  std::pair<int64_t, int64_t> device() const {
    py::tuple t = cuda.attr("mem_get_info")();
    return {t[0].cast<int64_t>(), t[1].cast<int64_t>()};
  }
};

// Runs one step of the measurement; running out of memory there, before any solution code ran,
// is the task's size, not a solution's doing.
template <typename Fn>
void measured(const CudaMemory& m, const std::string& what, Fn&& fn) {
  try {
    guarded(Category::kTaskError, "memory plan: " + what, fn);
  } catch (Failure& f) {
    if (f.category != Category::kOutOfMemory) throw;
    const auto [free, total] = m.device();
    throw Failure{Category::kTaskTooLarge,
                  fmt::format("{} does not fit in the GPU's memory ({} free of {}, before any solution code ran): {}",
                              what, format_bytes(free), format_bytes(total), f.message.substr(0, 600))};
  }
}

}  // namespace

void judge_plan_memory(Judge& j) {
  if (!j.gpu) return;
  const CudaMemory m;
  MemoryNeeds n;
  n.candidate = j.candidate != nullptr;
  n.bracket = j.wants_bracket();
  n.weights_bytes = module_bytes(j.reference);
  py::object inputs, out, out64;
  measured(m, "drawing one input set", [&] {
    inputs = draw_inputs(j.task, j.device, j.input_seed(0));
    n.input_bytes = static_cast<int64_t>(staged_bytes(inputs, /*padded=*/true));
    if (n.bracket) n.bracket_staging_bytes = static_cast<int64_t>(deferred_staging_bytes(inputs, "cuda"));
    synchronize(j.device);
  });
  measured(m, "the reference's forward", [&] {
    m.reset_peak();
    const int64_t base = m.allocated();
    out = call_model(j.reference, clone_tree(inputs));
    synchronize(j.device);
    n.reference_peak_bytes = m.peak() - base;
    n.output_bytes = static_cast<int64_t>(staged_bytes(out, /*padded=*/false));
  });
  j.reference_ran = true;
  if (j.opt.precision == "strict") {
    measured(m, "the float64 reference's forward", [&] {
      m.reset_peak();
      const int64_t base = m.allocated();
      out64 = j.float64_outputs(inputs);  // out of memory there: compared as loose, recorded
      synchronize(j.device);
      if (!out64.is_none()) {
        n.weights64_bytes = module_bytes(j.reference64);
        n.reference64_peak_bytes = m.peak() - base - n.weights64_bytes;
        n.output64_bytes = static_cast<int64_t>(staged_bytes(out64, /*padded=*/false));
      }
    });
  }
  inputs = out = out64 = py::none();
  m.cuda.attr("empty_cache")();
  m.reset_peak();
  const auto [free, total] = m.device();
  n.total_bytes = total;
  // What the judge's allocator still holds (the weights) is counted in the plan's needs.
  n.free_bytes = free + m.cuda.attr("memory_reserved")().cast<int64_t>();
  n.judge_limit_bytes = static_cast<int64_t>(j.opt.gpu_memory_fraction * static_cast<double>(total));
  j.plan = plan_memory(n);
  j.result.reports["memory"] = j.plan->to_json();
  if (!j.plan->fits()) throw Failure{Category::kTaskTooLarge, j.plan->too_large};
  if (!j.plan->float64_reference && j.reference64) {
    j.reference64 = py::object();
    j.reference64_unavailable = fmt::format(
        "the float64 reference does not fit beside the rest of the evaluation (its outputs {}, its working memory "
        "{}; the memory plan)",
        format_bytes(n.output64_bytes), format_bytes(n.reference64_peak_bytes));
    j.result.reports["reference64"] = {{"route", "none: compared as loose"}, {"error", j.reference64_unavailable}};
    m.cuda.attr("empty_cache")();
  }
}

void Judge::note_free() {
  if (!gpu) return;
  const int64_t free = CudaMemory().device().first;
  if (min_free_bytes < 0 || free < min_free_bytes) min_free_bytes = free;
}

void record_memory_peaks(Judge& j, const nlohmann::json& finished) {
  if (!j.gpu || !j.plan) return;
  try {
    const CudaMemory m;
    nlohmann::json peak = {{"judge_allocated_bytes", m.peak()},
                           {"judge_reserved_bytes", m.cuda.attr("max_memory_reserved")().cast<int64_t>()},
                           {"shared_blocks_bytes", j.shared_block_bytes()},
                           {"device_min_free_bytes", j.min_free_bytes}};
    // The candidate process's own count (its claim; informative only).
    if (finished.contains("gpu_peak_allocated_bytes")) peak["candidate_allocated_bytes"] = finished["gpu_peak_allocated_bytes"];
    j.result.reports["memory"]["peak"] = peak;
  } catch (const std::exception&) {
    // The peaks are a report; a CUDA context that died (an illegal access) has none to give.
  }
}

}  // namespace cuda_agent::sandbox

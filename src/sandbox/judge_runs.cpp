// The judge's side of one run of the candidate's forward: staging the inputs, checking the
// reply, reading the outputs back; and the reference and the comparison under the policy.
#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "cuda_agent/sandbox/python_tensor.h"
#include "cuda_agent/sandbox/task_check.h"
#include "cuda_agent/sandbox/task_runner.h"
#include "cuda_agent/sandbox/tensor_exchange.h"
#include "evaluation_support.h"
#include "judge.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

std::vector<KernelUse> parse_uses(const nlohmann::json& list, const std::string& where) {
  std::vector<KernelUse> uses;
  try {
    for (const auto& j : list) uses.push_back(KernelUse::from_json(j));
  } catch (const std::exception& e) {
    throw Failure{Category::kTampering, fmt::format("{}: the candidate process's kernel records are malformed ({})", where, e.what())};
  }
  return uses;
}

std::string list_kernels(const std::vector<KernelUse>& uses) {
  std::string out;
  for (const auto& u : uses)
    out += fmt::format("{}{} [{}{}{}] x{}", out.empty() ? "" : "; ", u.name, to_string(u.origin),
                       u.library.empty() ? "" : ": ", u.library, u.calls);
  return out;
}

}  // namespace

void Judge::enforce_provenance(const std::vector<KernelUse>& uses, uint64_t host_copy_bytes, const std::string& where) {
  if (opt.provenance == "off") return;
  ProvenanceReport p = classify_kernels(uses, opt.provenance_allow);
  p.host_copy_bytes = host_copy_bytes;
  provenance.merge(p);
  if (opt.provenance == "enforce" && p.violates()) throw Failure{Category::kForbiddenFallback, where + ": " + p.message()};
}

void Judge::audit_records(const nlohmann::json& reply, const std::string& where, const std::string& when) const {
  if (!reply.contains("outside")) return;  // no kernel records in this reply (the CPU)
  const std::string processes = reply.value("solution_processes", std::string());
  if (opt.integrity_checks && !processes.empty())
    throw Failure{Category::kTampering,
                  fmt::format("{}: {}: work outside the candidate process is out of the auditor's sight", where, processes)};
  const nlohmann::json contexts = reply.value("contexts_created", nlohmann::json::object());
  if (const uint64_t made = contexts.value("count", uint64_t{0}); opt.integrity_checks && made > 0)
    throw Failure{
        Category::kTampering,
        fmt::format("{}: {}", where, context_creation_message(made, contexts.value("first", std::string("?"))))};
  if (!opt.integrity_checks && opt.provenance != "enforce") return;
  if (reply.value("dropped_records", uint64_t{0}) > 0)
    throw Failure{Category::kInfrastructure,
                  fmt::format("{}: CUPTI dropped {} kernel records in the candidate process, so its kernels cannot be "
                              "audited (it could not get a buffer for them)",
                              where, reply.value("dropped_records", uint64_t{0}))};
  if (!reply.value("recording_probe", false))
    throw Failure{Category::kTampering,
                  fmt::format("{}: the sandbox's probe kernel left no record in the candidate process: CUPTI stopped "
                              "recording kernels or calling its launch callbacks there (switched off, its buffers "
                              "taken or CUPTI detached by the solution)",
                              where)};
  const nlohmann::json unrecorded = reply.value("unrecorded_launches", nlohmann::json::object());
  const uint64_t hidden = unrecorded.value("count", uint64_t{0});
  if (hidden > 0) {
    std::string first;
    for (const auto& a : unrecorded.value("first", nlohmann::json::array()))
      first += fmt::format("{}{} [{}]", first.empty() ? "" : "; ", a.value("library", std::string("?")),
                           a.value("origin", std::string("?")));
    throw Failure{Category::kTampering,
                  fmt::format("{}: {} kernel launch{} in the candidate process left no CUPTI kernel record (first: {}): "
                              "kernels ran unaudited, CUPTI's kernel activity switched off or redirected by the solution",
                              where, hidden, hidden == 1 ? "" : "es", first.empty() ? "?" : first)};
  }
  const nlohmann::json copies = reply.value("outside_copies", nlohmann::json::object());
  if (const uint64_t moved = copies.value("count", uint64_t{0}); opt.integrity_checks && moved > 0)
    throw Failure{Category::kTampering,
                  fmt::format("{}: the solution issued {} cop{} or fill{} ({} bytes) in the candidate process {}: data "
                              "moved where it is not timed (from a gc callback, a finalizer or a thread of its own)",
                              where, moved, moved == 1 ? "y" : "ies", moved == 1 ? "" : "s",
                              copies.value("bytes", uint64_t{0}), when)};
  const std::vector<KernelUse> outside = parse_uses(reply.value("outside", nlohmann::json::array()), where);
  if (opt.integrity_checks && !outside.empty())
    throw Failure{Category::kTampering,
                  fmt::format("{}: GPU work ran in the candidate process {}: {} (a background thread, or work moved "
                              "out of the timed forward)",
                              where, when, list_kernels(outside))};
}

int64_t Judge::input_seed(int64_t k) {
  CA_CHECK(k >= 0, "input set {}: no such set", k);
  if (!opt.secret_seeds) return opt.seed + k;
  std::random_device device;  // the kernel's entropy: nothing a solution in another process can read ahead
  while (static_cast<int64_t>(drawn_seeds.size()) <= k) {
    const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
    drawn_seeds.push_back(static_cast<int64_t>(bits & 0x7fffffffffffffffULL));
  }
  return drawn_seeds[static_cast<size_t>(k)];
}

double Judge::remaining() const {
  return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
}

namespace {

// `send` given the candidate's time: `bound` where it is positive and short of the deadline's
// `left`, the deadline otherwise; a timeout at the bound becomes `why()`'s timeout.
nlohmann::json within_bound(double left, bool bounded, double bound, const std::function<nlohmann::json(double)>& send,
                            const std::function<std::string()>& why) {
  if (!bounded || bound >= left) return send(left);
  try {
    return send(bound);
  } catch (const Failure& f) {
    if (f.category != Category::kTimeout) throw;
    throw Failure{Category::kTimeout, why()};
  }
}

}  // namespace

nlohmann::json Judge::call_forwards(const std::string& where, const nlohmann::json& op, const std::string& expect,
                                    int forwards, double extra_s, const std::function<nlohmann::json(double)>& call) {
  const double bound = opt.forward_timeout_s * std::max(forwards, 1) + extra_s;
  return within_bound(
      remaining(), opt.forward_timeout_s > 0, bound,
      [&](double timeout_s) { return call ? call(timeout_s) : candidate->call(where, op, expect, timeout_s); },
      [&] {
        return fmt::format(
            "{}: ModelNew.forward did not return within sandbox.forward_timeout_s ({:g} s a forward, "
            "{:g} s for this call); the candidate was stopped, so that the GPU's lock goes to the "
            "evaluations waiting for it. An endless kernel or a hanging call is the usual cause; a "
            "solution this slow needs a larger sandbox.forward_timeout_s",
            where, opt.forward_timeout_s, bound);
      });
}

nlohmann::json Judge::call_harness(const std::string& where, const nlohmann::json& op, const std::string& expect,
                                   const std::vector<int>& fds) {
  return within_bound(
      remaining(), opt.forward_timeout_s > 0, opt.forward_timeout_s,
      [&](double timeout_s) { return candidate->call(where, op, expect, timeout_s, fds); },
      [&] {
        return fmt::format(
            "{}: the candidate's harness did not answer within sandbox.forward_timeout_s ({:g} s), "
            "for work that takes it well under a second; something the solution left running held "
            "it (GPU work of a context of its own, which CUPTI's flush waits on; a lock; a thread). "
            "The candidate was stopped, so that the GPU's lock goes to the evaluations waiting for it",
            where, opt.forward_timeout_s);
      });
}

nlohmann::json Judge::call_load(const nlohmann::json& op, bool builds_left, double extra_s) {
  const double bound = kLoadForwards * opt.forward_timeout_s + extra_s;
  return within_bound(
      remaining(), opt.forward_timeout_s > 0 && !builds_left, bound,
      [&](double timeout_s) { return candidate->call("", op, "loaded", timeout_s); },
      [&] {
        return fmt::format(
            "the solution's load (its import and ModelNew(...)) did not end within {:g} s ({} times "
            "sandbox.forward_timeout_s, and twice the prebuild's import where one ran: no nvcc build was left to "
            "make in it); the candidate was stopped, so that "
            "the GPU's lock goes to the evaluations waiting for it. Code at import that waits on an endless kernel "
            "or loops is the usual cause; a load this slow needs a larger sandbox.forward_timeout_s",
            bound, kLoadForwards);
      });
}

namespace {

// A float64 copy of a reference model: .double() converts its floating parameters and buffers,
// and complex ones become complex128 (.double() leaves them as they are); tensors a module keeps
// as plain attributes (an LSTM's initial hidden state, say, which .double() leaves in float32)
// are converted as well.
py::object float64_copy(py::handle model) {
  py::module_ torch = py::module_::import("torch");
  py::object copy = py::module_::import("copy").attr("deepcopy")(model).attr("double")();
  copy.attr("_apply")(py::cpp_function([](py::object t) { return to_float64(t); }));
  py::object tensor_type = torch.attr("Tensor");
  for (py::handle module : copy.attr("modules")()) {
    py::dict attributes = module.attr("__dict__");
    for (auto item : py::list(attributes.attr("items")())) {
      py::tuple pair = item.cast<py::tuple>();
      py::object value = pair[1];
      if (py::isinstance(value, tensor_type)) attributes[pair[0]] = to_float64(value);
    }
  }
  return copy;
}

// A TorchFunctionMode under which every floating dtype the code names is float64 (complex ones
// complex128): `.float()`, `.half()` and `.bfloat16()` become `.double()`, and a dtype passed to
// any torch function or tensor method (`.to(torch.float32)`, `torch.zeros(..., dtype=...)`,
// `softmax(..., dtype=...)`) is promoted, but in `view(dtype)`, which reinterprets bits. Without
// it a reference that casts inside its forward gave float32 outputs in its float64 run too, and
// strict had nothing to compare them with.
py::object float64_mode() {
  static py::object mode_type = [] {
    py::dict scope;
    py::exec(R"PY(
import torch
from torch.overrides import TorchFunctionMode

_WIDE = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
         torch.complex64: torch.complex128, torch.complex32: torch.complex128}
_CASTS = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


def _wide(v):
    return _WIDE.get(v, v) if isinstance(v, torch.dtype) else v


class Float64Everywhere(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CASTS:
            return args[0].double()
        if func is not torch.Tensor.view:
            args = tuple(_wide(a) for a in args)
            kwargs = {k: _wide(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)
)PY",
             scope);
    return py::object(scope["Float64Everywhere"]);
  }();
  return mode_type();
}

// Runs the float64 reference with float64 as torch's default dtype, so tensors its forward
// creates without a dtype match it, and with the dtypes it names promoted (float64_mode).
py::object call_float64(py::handle model, py::handle inputs) {
  py::module_ torch = py::module_::import("torch");
  py::object previous = torch.attr("get_default_dtype")();
  torch.attr("set_default_dtype")(torch.attr("float64"));
  py::object mode = float64_mode();
  mode.attr("__enter__")();
  try {
    py::object out = call_model(model, inputs);
    mode.attr("__exit__")(py::none(), py::none(), py::none());
    torch.attr("set_default_dtype")(previous);
    return out;
  } catch (...) {
    mode.attr("__exit__")(py::none(), py::none(), py::none());
    torch.attr("set_default_dtype")(previous);
    throw;
  }
}

}  // namespace

py::object Judge::float64_outputs(py::handle inputs) {
  // A task whose model cannot run in float64 is still evaluated: strict then compares as
  // loose, and the result says why (reports.reference64).
  if (opt.precision != "strict" || !reference64_unavailable.empty()) return py::none();
  try {
    if (!reference64) {
      reference64 = float64_copy(reference);
      result.reports["reference64"] = {{"route", "float64 copy (parameters, buffers and tensor attributes)"}};
    }
    py::object out = call_float64(reference64, to_float64(clone_tree(inputs)));
    reference64_ran = true;
    return out;
  } catch (const std::exception& e) {
    if (solution_started && reference64_ran)
      throw Failure{Category::kRuntimeError,
                    fmt::format("the float64 reference (strict) had run in this evaluation, but failed after the "
                                "solution's code started beside it (charged to the solution, as a reference that "
                                "fails so: its GPU memory, say): {}",
                                std::string(e.what()).substr(0, 600))};
    reference64_unavailable = e.what();
    if (reference64_unavailable.size() > 500) reference64_unavailable.resize(500);
    result.reports["reference64"] = {{"route", "none: compared as loose"}, {"error", reference64_unavailable}};
    reference64 = py::object();  // its memory goes back (released with the caller's release_cached)
    return py::none();
  }
}

void Judge::reference_outputs(py::handle inputs, py::object* out, std::string* view) {
  {
    py::object given = clone_tree(inputs);
    *out = call_model(reference, given);
    if (view) *view = view_of_input(*out, given);
  }
  synchronize(device);
  release_cached();
  reference_ran = true;
}

void Judge::release_cached() {
  if (plan && plan->release_cached) py::module_::import("torch").attr("cuda").attr("empty_cache")();
}

CompareResult Judge::compare(py::handle ref, py::handle ref64, py::handle outputs) const {
  return opt.precision == "strict"
             ? compare_outputs_strict(ref, ref64, outputs, opt.atol, opt.rtol, opt.strict_factor, opt.strict_floor)
             : compare_outputs(ref, outputs, opt.atol, opt.rtol);
}

void Judge::send_blocks(bool input, bool output) {
  nlohmann::json blocks = nlohmann::json::array();
  std::vector<int> fds;
  if (input) blocks.push_back({{"role", "input"}, {"bytes", in_block_->bytes()}}), fds.push_back(in_block_->fd());
  if (output) blocks.push_back({{"role", "output"}, {"bytes", out_block_->bytes()}}), fds.push_back(out_block_->fd());
  call_harness("sharing the input and output blocks", {{"op", "blocks"}, {"blocks", blocks}}, "mapped", fds);
}

nlohmann::json Judge::stage(py::handle inputs, bool deferred) {
  const size_t need = std::max<size_t>(staged_bytes(inputs, /*padded=*/true), 1);
  if (!in_block_ || in_block_->bytes() < need) {
    in_block_ = SharedBlock::create(gpu ? MemoryKind::kDevice : MemoryKind::kHost, need);
    in_tensor_ = in_block_->byte_tensor();
    send_blocks(true, false);
  }
  // In the bracket the inputs reach the input block only when the bracket's copies run, once the
  // candidate's run is queued.
  bracket_inputs_.clear();
  bracket_held_.clear();
  nlohmann::json spec = deferred ? stage_tree_deferred(inputs, in_tensor_, &bracket_inputs_, &bracket_held_)
                                 : stage_tree(inputs, in_tensor_);
  synchronize(device);
  return spec;
}

void Judge::reserve_outputs(py::handle like) {
  // Twice the reference's bytes (room for a candidate output that is a view with gaps) unless
  // the memory plan says once.
  const double factor = plan ? plan->output_block_factor : 2.0;
  const size_t need = static_cast<size_t>(factor * static_cast<double>(staged_bytes(like, /*padded=*/false))) + (size_t{1} << 20);
  if (out_block_ && out_block_->bytes() >= need) return;
  out_block_ = SharedBlock::create(gpu ? MemoryKind::kDevice : MemoryKind::kHost, need);
  out_tensor_ = out_block_->byte_tensor();
  send_blocks(false, true);
}

std::vector<GpuActivity> Judge::report_deferred_runs(const std::vector<std::string>& wheres) {
  if (!gpu) return {};
  const nlohmann::json reply = call_harness("reporting the timed runs' kernels", {{"op", "report"}}, "reported");
  audit_records(reply, "the timed runs", "while no forward was running");  // first, as in run_candidate
  const nlohmann::json runs = reply.value("runs", nlohmann::json::array());
  for (size_t i = 0; i < runs.size() && i < wheres.size(); ++i) {
    const std::vector<KernelUse> uses = parse_uses(runs[i], wheres[i]);
    enforce_provenance(uses, 0, wheres[i]);  // the host copies are reported for all the runs together
    merge_kernel_uses(timed_kernels, uses);
  }
  const uint64_t host_bytes = reply.value("host_copy_bytes", uint64_t{0});
  if (opt.provenance == "enforce" && host_bytes > ProvenanceReport::kHostCopyLimit * std::max<size_t>(wheres.size(), 1)) {
    ProvenanceReport p;
    p.own = 1;
    p.host_copy_bytes = host_bytes;
    throw Failure{Category::kForbiddenFallback, "the timed runs: " + p.message()};
  }
  std::vector<GpuActivity> activity;
  const nlohmann::json gpu_runs = reply.value("gpu", nlohmann::json::array());
  try {
    for (const auto& g : gpu_runs) {
      GpuActivity a;
      a.busy_ms = g.at("busy_ms").get<double>();
      a.span_ms = g.at("span_ms").get<double>();
      if (!(a.busy_ms >= 0 && a.span_ms >= a.busy_ms - 1e-6)) throw std::runtime_error("impossible GPU times");
      activity.push_back(a);
    }
  } catch (const std::exception& e) {
    throw Failure{Category::kTampering,
                  fmt::format("the timed runs: the candidate process's GPU times are malformed ({})", e.what())};
  }
  if (!activity.empty() && activity.size() != wheres.size())
    throw Failure{Category::kTampering,
                  fmt::format("the timed runs: the candidate process reported GPU times for {} of {} runs",
                              activity.size(), wheres.size())};
  return activity;
}

void Judge::warm_up_candidate(py::handle inputs, bool keep) {
  nlohmann::json spec;
  guarded(Category::kTaskError, "warm-up: handing the inputs to the candidate", [&] { spec = stage(inputs); });
  const nlohmann::json reply = call_forwards(
      "warm-up", {{"op", "warmup"}, {"inputs", spec}, {"runs", opt.warmup_runs}, {"ms", opt.warmup_ms}, {"keep", keep}},
      "warmed", opt.warmup_runs, opt.warmup_ms / 1000.0);
  audit_records(reply, "warm-up", "while no forward was running");
  candidate_backends = reply.value("backends", nlohmann::json());
}

void Judge::audit_idle(const nlohmann::json& finished) {
  const nlohmann::json idle = finished.value("idle", nlohmann::json());
  if (!idle.is_object()) return;
  const double cpu = idle.value("cpu_s", 0.0), wall = idle.value("wall_s", 0.0);
  result.reports["candidate_idle"] = {{"cpu_s", cpu}, {"wall_s", wall}};
  if (opt.integrity_checks && cpu > kIdleCpuFloorS && cpu > kIdleCpuShare * wall)
    throw Failure{Category::kTampering,
                  fmt::format("the candidate process used {:.2f} s of CPU while it waited {:.2f} s for the judge: "
                              "threads of the solution's (native ones included) ran beside the judge's work, its "
                              "timing of the baselines among it",
                              cpu, wall)};
}

void Judge::pre_run_candidate(const std::string& where) {
  (void)call_forwards(where + ": the pre-run", {{"op", "prerun"}}, "preran", 1);
}

nlohmann::json Judge::call_in_bracket(const std::string& where, nlohmann::json op, const std::string& expect,
                                      int forwards, size_t out_bytes, double* span_ms, bool* held) {
  const uint32_t ticket = bracket->next_ticket();
  op["bracket"] = ticket;
  // Whatever ends the call, nothing of the bracket stays queued on the judge's stream, and the
  // copies held for its inputs go with it.
  struct Abandon {
    JudgeBracket& b;
    std::vector<InputCopy>& inputs;
    std::vector<py::object>& held;
    ~Abandon() {
      b.abandon();
      inputs.clear();
      held.clear();
    }
  } abandon{*bracket, bracket_inputs_, bracket_held_};
  const auto go = [&] {
    bracket->queue(bracket_inputs_, in_block_ ? in_block_->address() : 0, out_block_ ? out_block_->address() : 0,
                   data_address(snapshot_), out_bytes);
  };
  bool went = false, in_time = false;
  const nlohmann::json reply = call_forwards(where, op, expect, forwards, 0, [&](double timeout_s) {
    return candidate->call_bracketed(where, op, expect, timeout_s, static_cast<double>(kHoldTimeoutNs) / 1e9, go, &went,
                                     &in_time);
  });
  if (!went)
    throw Failure{Category::kTampering,
                  where + ": the candidate process replied without saying its run was queued in the judge's bracket"};
  // The reply comes once the candidate's host synchronized: its done word was written before.
  if (!bracket->finish(std::min(2.0, remaining())))
    throw Failure{Category::kTampering,
                  where +
                      ": the candidate process never wrote the bracket's done word, which its run queues after "
                      "the outputs' copies: its outputs cannot be taken as written"};
  *span_ms = bracket->span_ms();
  if (held) *held = in_time;
  return reply;
}

void Judge::calibrate_bracket() {
  // The first runs warm the path up (the candidate's first stream operations, the allocator).
  constexpr int kWarmRuns = 3, kRuns = 16;
  const std::string where = "the judge's bracket's calibration (before the solution loads)";
  bracket = std::make_unique<JudgeBracket>();
  nlohmann::json blocks = nlohmann::json::array();
  blocks.push_back({{"role", "bracket"}, {"bytes", bracket->words().bytes()}});
  call_harness(where, {{"op", "blocks"}, {"blocks", blocks}}, "mapped", {bracket->words().fd()});
  const int64_t bytes = plan ? plan->needs.output_bytes : 0;
  const auto calibrate = [&](int warm) {
    std::vector<double> spans;
    for (int i = 0; i < warm + kRuns; ++i) {
      double span = 0;
      const nlohmann::json reply =
          call_in_bracket(where, {{"op", "probe"}, {"bytes", bytes}}, "probed", 1, 0, &span, nullptr);
      // The probe's own interval (its fill) is the "forward": not the bracket's cost. The process
      // has run no solution code yet, so its timing is the harness's.
      if (i >= warm) spans.push_back(span - reply.value("ms", 0.0));
    }
    return calibration_of(std::move(spans));
  };
  bracket_calibration = calibrate(kWarmRuns);
  // A calibration disturbed by something else on the machine (one of 22 on data/core, H100,
  // 2026-12-07: a spread of 0.34 ms) loosens every floor of the evaluation: once more, and the
  // tighter of the two (both are the harness's own measurements).
  if (calibration_noisy(bracket_calibration)) {
    const BracketCalibration again = calibrate(0);
    if (again.median_ms + again.spread_ms < bracket_calibration.median_ms + bracket_calibration.spread_ms)
      bracket_calibration = again;
    bracket_calibration.runs = 2 * kRuns;
  }
}

CandidateRun Judge::run_candidate(py::handle inputs, const RunFlags& flags, const std::string& where) {
  const bool bracketed = flags.bracket && bracket != nullptr;
  nlohmann::json spec;
  guarded(Category::kTaskError, where + ": handing the inputs to the candidate",
          [&] { spec = stage(inputs, bracketed); });
  const nlohmann::json op = {{"op", "run"},
                             {"inputs", spec},
                             {"guard", flags.guard},
                             {"poison", flags.poison},
                             {"full_checks", flags.full_checks},
                             {"defer_report", flags.defer_report},
                             {"release", plan && plan->release_cached}};
  CandidateRun run;
  bool held = true;
  if (bracketed) {
    CA_CHECK(out_block_ != nullptr, "a bracketed run before the output block exists");
    guarded(Category::kRuntimeError, where + ": the judge's copy of the outputs",
            [&] { (void)grow_byte_buffer(snapshot_, out_block_->bytes(), device); });
  }
  const auto sent = Clock::now();
  run.reply = bracketed ? call_in_bracket(where, op, "ran", 1, out_block_->bytes(), &run.bracket_ms, &held)
                        : call_forwards(where, op, "ran", 1);
  run.round_trip_ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
  note_free();
  const nlohmann::json& r = run.reply;
  if (!r.contains("ms") || !r["ms"].is_number() || r["ms"].get<double>() < 0)
    throw Failure{Category::kTampering, where + ": the candidate process's reply has no timing"};
  run.ms = r["ms"].get<double>();
  run.host_ms = r.value("host_ms", 0.0);
  run.joined = r.value("joined", true);
  run.held = bracketed ? held : r.value("held", true);

  if (gpu && !flags.defer_report) {
    // The records are audited before provenance reads them: a blinded recorder's verdict
    // (tampering) comes before what its missing records would suggest (no own kernels).
    audit_records(r, where, "while no forward was running");
    run.kernels = parse_uses(r.value("kernels", nlohmann::json::array()), where);
    enforce_provenance(run.kernels, r.value("host_copy_bytes", uint64_t{0}), where);
  }
  if (opt.integrity_checks) {
    const std::string why = r.value("tampering", "");
    if (!why.empty()) throw Failure{Category::kTampering, where + ": the solution tampered with the sandbox: " + why};
    if (const std::string late = r.value("output_changed_after_export", ""); !late.empty())
      throw Failure{Category::kTampering,
                    fmt::format("{}: {} changed after the forward returned and its bytes were copied out: work of the "
                                "solution's went on writing it, outside the forward's time",
                                where, late)};
    std::string changed;
    guarded(Category::kRuntimeError, where + ": checking the inputs", [&] { changed = changed_tensor(inputs, spec, in_tensor_); });
    if (!changed.empty())
      throw Failure{Category::kInputModified, fmt::format("{}: ModelNew.forward modified its inputs: {} was modified in "
                                                          "place",
                                                          where, changed)};
  }
  // After the inputs' check: a forward that wrote into an input and returned it modified it.
  const std::string view = r.value("output_view_of_input", "");
  if (!view.empty())
    throw Failure{Category::kInvalidOutput,
                  fmt::format("{}: {} is a view of the forward's inputs (its data lies in them): an output must be "
                              "computed into memory of its own, not returned from what was given",
                              where, view)};
  if (const std::string alias = r.value("output_reads_inputs", ""); !alias.empty())
    throw Failure{Category::kInvalidOutput,
                  fmt::format("{}: {} reads the forward's inputs through memory outside their block (its bytes changed "
                              "when the inputs' did: the inputs' memory mapped a second time): an output must be "
                              "computed into memory of its own, not read from what was given",
                              where, alias)};
  try {
    // In the bracket, what the judge copied out when the done word came, not what the block holds now.
    run.outputs = build_tree(r.at("outputs"), bracketed ? snapshot_ : out_tensor_);
  } catch (const std::exception& e) {
    throw Failure{Category::kTampering, fmt::format("{}: the candidate process described its outputs wrongly ({})", where, e.what())};
  }
  return run;
}

}  // namespace cuda_agent::sandbox

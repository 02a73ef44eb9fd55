# The canary on the target machine: `python -m <package>.canary` (what `cuda-agent canary` runs
# after checking the files). Re-verifies the kernels against the reference on fresh inputs, times
# them against the fallback in interleaved rounds, and exits non-zero with the reason when they
# are wrong, slower than the fallback by more than the margin, or not what runs here (the guard
# falls back). --rollback then switches the package to its fallback in place (state.json).
import argparse
import datetime
import importlib
import json
import os
import random
import statistics
import sys

import torch


def _to_cuda(values):
    return [v.cuda() if isinstance(v, torch.Tensor) else v for v in values]


def _outputs(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _outputs(v)]
    return []


def _time(fn, inputs):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn(*inputs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def run(package, trials, runs, margin):
    pkg = importlib.import_module(package)
    report = {"package": package, "checked": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "mode": pkg.mode(), "trials": [], "margin": margin}

    def fail(problem):
        report["ok"], report["problem"] = False, problem
        return report

    if pkg.mode() != "kernel":
        return fail("the package runs its fallback: %s" % pkg.reason())
    if not torch.cuda.is_available():
        return fail("no CUDA GPU here: the canary verifies and times the kernels on the target machine's GPU")
    options = pkg.AUDIT.get("result", {}).get("options", {})
    atol, rtol = options.get("atol", 1e-2), options.get("rtol", 1e-2)
    init = pkg.get_init_inputs()
    model = pkg.Model(*init).cuda().eval()
    ref = pkg.reference.Model(*init)
    ref.load_state_dict(model.state_dict())
    ref = ref.cuda().eval()
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    with torch.no_grad():
        for _ in range(trials):
            seed = rng.randrange(2**31)
            torch.manual_seed(seed)
            inputs = _to_cuda(pkg.get_inputs())
            why = model.kernel_reason(*inputs)
            if why is not None:
                return fail("the guard sends the task's own inputs to the fallback here: %s" % why)
            before = pkg.stats()["kernel_calls"]
            got, want = _outputs(model(*inputs)), _outputs(ref(*inputs))
            if pkg.stats()["kernel_calls"] != before + 1:
                return fail("the call did not run the kernels: %s" % pkg.stats()["fallbacks"])
            trial = {"seed": seed, "max_abs_error": 0.0}
            report["trials"].append(trial)
            if len(got) != len(want):
                return fail("seed %d: %d outputs, the reference gives %d" % (seed, len(got), len(want)))
            for i, (g, w) in enumerate(zip(got, want)):
                if g.shape != w.shape or g.dtype != w.dtype:
                    return fail("seed %d: output %d is %s %s, the reference's %s %s" % (
                        seed, i, list(g.shape), g.dtype, list(w.shape), w.dtype))
                if not g.dtype.is_floating_point:
                    if not torch.equal(g, w):
                        return fail("seed %d: output %d differs from the reference" % (seed, i))
                    continue
                gd, wd = g.double(), w.double()
                trial["max_abs_error"] = max(trial["max_abs_error"], float((gd - wd).abs().max()) if g.numel() else 0.0)
                if not torch.allclose(gd, wd, atol=atol, rtol=rtol, equal_nan=True):
                    return fail("seed %d: output %d differs from the reference beyond atol %g, rtol %g "
                                "(max abs error %g)" % (seed, i, atol, rtol, trial["max_abs_error"]))
        inputs = _to_cuda(pkg.get_inputs())
        for _ in range(3):  # warm-up: torch.compile builds here
            model(*inputs)
            model.fallback_forward(*inputs)
        kernel_ms, fallback_ms = [], []
        for _ in range(runs):  # interleaved, so that drift hits both
            kernel_ms.append(_time(model, inputs))
            fallback_ms.append(_time(model.fallback_forward, inputs))
    report["kernel_ms"] = statistics.median(kernel_ms)
    report["fallback_ms"] = statistics.median(fallback_ms)
    report["speedup_vs_fallback"] = report["fallback_ms"] / report["kernel_ms"] if report["kernel_ms"] else None
    if report["kernel_ms"] > report["fallback_ms"] * (1 + margin):
        return fail("the kernels are slower than the fallback (%s): %.4f ms against %.4f ms, beyond the %g margin" % (
            pkg.MANIFEST["fallback"], report["kernel_ms"], report["fallback_ms"], margin))
    report["ok"] = True
    return report


def rollback(package_dir, problem):
    state = {"mode": "fallback", "reason": problem,
             "at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    path = os.path.join(package_dir, "state.json")
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=2)
    os.replace(path + ".tmp", path)


def main(argv=None):
    package = __package__ or "package"
    parser = argparse.ArgumentParser(prog="python -m %s.canary" % package, description=__doc__)
    parser.add_argument("--trials", type=int, default=5, help="fresh input draws compared with the reference")
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each side, interleaved")
    parser.add_argument("--margin", type=float, default=0.05,
                        help="fail when the kernels are slower than the fallback by more than this fraction")
    parser.add_argument("--rollback", action="store_true", help="on failure switch the package to its fallback")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report", help="also write the report as JSON into this file")
    args = parser.parse_args(argv)
    try:
        report = run(package, args.trials, args.runs, args.margin)
    except Exception as e:
        report = {"package": package, "ok": False, "problem": "the canary raised %s: %s" % (type(e).__name__, e)}
    if not report["ok"] and args.rollback:
        rollback(os.path.dirname(os.path.abspath(__file__)), report["problem"])
        report["rolled_back"] = True
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
    if args.json:
        print(json.dumps(report, indent=2))
    elif report["ok"]:
        print("canary %s: ok: %d trials match the reference; kernels %.4f ms, fallback %.4f ms (%.2fx)" % (
            package, len(report["trials"]), report["kernel_ms"], report["fallback_ms"], report["speedup_vs_fallback"]))
    else:
        print("canary %s: FAILED: %s%s" % (package, report["problem"],
                                          "; rolled back to the fallback" if report.get("rolled_back") else ""))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

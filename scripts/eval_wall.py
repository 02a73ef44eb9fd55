#!/usr/bin/env python3
"""Wall time of evaluations, per bench output folder: the median and spread of each result's
wall_seconds, the median of each phase, of each part of the verify phase (verify_seconds) and of
each part of the profile phase
(profile_seconds: warm-ups, the rounds' inputs, eager, torch.compile, candidate and
comparison, the kernel records) and of the solution's load (load_seconds, the candidate
process's account of it), and how the judge and candidate processes came to be.

    scripts/eval_wall.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a `cuda-agent bench --output` folder (its results/*.json are read)."""
import collections
import glob
import json
import os
import statistics
import sys


def summarize(run_dir):
    results = []
    for path in sorted(glob.glob(os.path.join(run_dir, "results", "*.json"))):
        with open(path) as f:
            results.append(json.load(f))
    if not results:
        sys.exit(f"{run_dir}: no results/*.json")
    walls = [r["wall_seconds"] for r in results]
    phases = collections.defaultdict(list)
    parts = collections.defaultdict(list)
    loads = collections.defaultdict(list)
    checks = collections.defaultdict(list)
    for r in results:
        for name, seconds in (r.get("verify_seconds") or {}).items():
            checks[name].append(seconds)
        for name, seconds in (r.get("load_seconds") or {}).items():
            loads[name].append(seconds)
        for name, seconds in (r.get("phase_seconds") or {}).items():
            phases[name].append(seconds)
        for name, seconds in (r.get("profile_seconds") or {}).items():
            parts[name].append(seconds)
    started = collections.Counter(
        f"judge {r.get('processes', {}).get('judge', '?')}, candidate {r.get('processes', {}).get('candidate', '?')}"
        for r in results)
    passed = sum(1 for r in results if r.get("correct"))
    return walls, phases, parts, loads, checks, started, passed, len(results)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    print("| run | evaluations | pass | wall median s | wall min-max s | python_start median s | processes |")
    print("|---|---|---|---|---|---|---|")
    details = []
    for run_dir in argv[1:]:
        walls, phases, parts, loads, checks, started, passed, n = summarize(run_dir)
        py = statistics.median(phases["python_start"]) if phases["python_start"] else 0.0
        print(f"| {os.path.basename(run_dir.rstrip('/'))} | {n} | {passed} | {statistics.median(walls):.2f} | "
              f"{min(walls):.2f}-{max(walls):.2f} | {py:.2f} | "
              + "; ".join(f"{count}x {what}" for what, count in started.most_common()) + " |")
        details.append((run_dir, phases, parts, loads, checks))
    for run_dir, phases, parts, loads, checks in details:
        print(f"\n{os.path.basename(run_dir.rstrip('/'))}, phase medians (s): "
              + ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in sorted(phases.items()) if v))
        if checks:
            print(f"{os.path.basename(run_dir.rstrip('/'))}, verify's parts, medians (s): "
                  + ", ".join(f"{name} {statistics.median(v):.3f}" for name, v in sorted(checks.items())))
        if parts:
            print(f"{os.path.basename(run_dir.rstrip('/'))}, profile's parts, medians (s): "
                  + ", ".join(f"{name} {statistics.median(v):.3f}" for name, v in sorted(parts.items())))
        if loads:
            print(f"{os.path.basename(run_dir.rstrip('/'))}, load_solution's parts (the candidate's account), "
                  "medians (s): " + ", ".join(f"{name} {statistics.median(v):.3f}" for name, v in sorted(loads.items())))


if __name__ == "__main__":
    main(sys.argv)

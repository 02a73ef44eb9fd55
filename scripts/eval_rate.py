#!/usr/bin/env python3
"""Evaluations a GPU-minute of one bench run, in its steady state: the results' files are
written as their evaluations end, so their modification times are the ends. The rate counts the
evaluations that ended after the first SKIP (the judges' first start, which a long run pays once)
over the time from the SKIP-th end to the last. Also the mean span an evaluation holds the GPU's
exclusive lock (its phases from CUDA's start to its processes' ends) and the ceiling it sets on
the rate when the lock is never idle.

    scripts/eval_rate.py RUN_DIR [--skip SKIP]

RUN_DIR is a `cuda-agent bench --output` folder (its results/*.json are read)."""
import argparse
import glob
import json
import os
import statistics

# Phases spent outside the GPU's exclusive lock (docs/results.md, phase_seconds).
OUTSIDE_LOCK = {"candidate_start", "python_start", "compile_import", "gpu_wait", "init_wait", "compile_wait",
                "precompile"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--skip", type=int, default=4)
    args = parser.parse_args()
    args.skip = max(args.skip, 1)
    paths = glob.glob(os.path.join(args.run_dir, "results", "*.json"))
    if len(paths) <= args.skip + 1:
        raise SystemExit(f"{args.run_dir}: {len(paths)} results, too few to skip {args.skip}")
    ends = sorted(os.path.getmtime(p) for p in paths)
    spans, passed = [], 0
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        passed += bool(r.get("correct"))
        phases = r.get("phase_seconds") or {}
        if phases:
            spans.append(sum(v for k, v in phases.items() if k not in OUTSIDE_LOCK))
    steady = (len(ends) - args.skip) / max(ends[-1] - ends[args.skip - 1], 1e-9)
    overall = len(ends) / max(ends[-1] - ends[0], 1e-9)
    print(f"evaluations: {len(ends)}, passed {passed}")
    print(f"steady state (after the first {args.skip} ends): {steady * 60:.1f} a minute "
          f"({len(ends) - args.skip} in {ends[-1] - ends[args.skip - 1]:.1f} s)")
    print(f"first end to last: {overall * 60:.1f} a minute")
    if spans:
        mean = statistics.mean(spans)
        print(f"locked span: mean {mean:.2f} s, median {statistics.median(spans):.2f} s, sum {sum(spans):.1f} s; "
              f"ceiling {60 / mean:.1f} a minute; lock busy {sum(spans) / max(ends[-1] - ends[0], 1e-9):.0%} "
              "of first end to last (the first evaluations' spans included)")


if __name__ == "__main__":
    main()

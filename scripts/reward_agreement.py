#!/usr/bin/env python3
"""Issue 17's repeatability figures from N bench folders of the same split and solutions:
per task, whether every pair of evaluations gave the same reward, and the coefficient of
variation of speedup_vs_eager over the evaluations (reported for tasks whose candidate median is
at least 0.1 ms, the issue's bar, and for all). Beside it, what splits that spread between the GPU
and the timer: the CV of the candidate's CUPTI kernel time per forward (the kernel itself running
faster in one process than in another) and the CV of the timed median over that kernel time (what
the timer adds).

Usage: reward_agreement.py BENCH_DIR [BENCH_DIR ...]   (each with results/<id>.json)
"""
import itertools
import json
import os
import statistics
import sys


def load(folder):
    out = {}
    results = os.path.join(folder, "results")
    for name in sorted(os.listdir(results)):
        if name.endswith(".json"):
            with open(os.path.join(results, name)) as f:
                out[name[:-5]] = json.load(f)
    return out


def cv_of(values):
    ok = [v for v in values if isinstance(v, (int, float))]
    if len(ok) < 2 or statistics.mean(ok) <= 0:
        return None
    return statistics.stdev(ok) / statistics.mean(ok)


def percent(cv):
    return "-" if cv is None else f"{100 * cv:.2f}%"


def main(folders):
    if len(folders) < 2:
        sys.exit("give at least two bench folders")
    runs = [load(f) for f in folders]
    tasks = sorted(set.intersection(*(set(r) for r in runs)))
    pairs = agree = 0
    rows = []
    for task in tasks:
        rewards = [r[task].get("reward") for r in runs]
        speedups = [r[task].get("speedup_vs_eager") for r in runs]
        candidates = [((r[task].get("timings") or {}).get("candidate") or {}) for r in runs]
        medians = [c.get("median_ms") for c in candidates]
        kernels = [c.get("gpu_kernel_ms") for c in candidates]
        over_kernel = [m / k for m, k in zip(medians, kernels)
                       if isinstance(m, (int, float)) and isinstance(k, (int, float)) and k > 0]
        for a, b in itertools.combinations(rewards, 2):
            pairs += 1
            agree += a == b
        cv = cv_of(speedups)
        median_ms = statistics.median([m for m in medians if isinstance(m, (int, float))] or [0.0])
        rows.append((task, rewards, cv, median_ms, cv_of(kernels), cv_of(over_kernel)))
    print("| task | candidate median ms | rewards | speedup CV | CUPTI kernel CV | timed / CUPTI CV |")
    print("|---|---|---|---|---|---|")
    for task, rewards, cv, median_ms, kernel_cv, timer_cv in rows:
        print(f"| {task} | {median_ms:.3f} | {' '.join(str(r) for r in rewards)} | {percent(cv)} | "
              f"{percent(kernel_cv)} | {percent(timer_cv)} |")
    big = [cv for _, _, cv, m, _, _ in rows if cv is not None and m >= 0.1]
    every = [cv for _, _, cv, _, _, _ in rows if cv is not None]
    timer = [t for *_, t in rows if t is not None]
    print()
    print(f"{len(runs)} evaluations of {len(tasks)} tasks: the reward agrees in {agree} of {pairs} pairs "
          f"({100.0 * agree / max(pairs, 1):.1f}%; target 98%)")
    if big:
        print(f"speedup CV, candidate >= 0.1 ms ({len(big)} tasks): median {100 * statistics.median(big):.2f}%, "
              f"max {100 * max(big):.2f}% (target under 2%)")
    if every:
        print(f"speedup CV, every task: median {100 * statistics.median(every):.2f}%, max {100 * max(every):.2f}%")
    if timer:
        print(f"timed median / CUPTI kernel time, CV over the evaluations (what the timer adds): "
              f"median {100 * statistics.median(timer):.2f}%, max {100 * max(timer):.2f}%")


if __name__ == "__main__":
    main(sys.argv[1:])

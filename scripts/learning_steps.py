#!/usr/bin/env python3
"""A training run's steps as a Markdown table, and links to its per-step plots (issue 18's report).

    scripts/learning_steps.py RUN_DIR [LINK_BASE]

Reads RUN_DIR/metrics.jsonl (one record a step, as `cuda-agent train` writes it) and prints one
row a step: the stage, its episodes (the teacher's and the actor's own), reward mean, pass rate,
faster-than-compile rate, RFT's kept count, the losses and the step's wall time; then whether the
last PPO step's reward is below its first (collapse), and links to RUN_DIR/plots/reward.svg and
rates.svg where they exist (relative to LINK_BASE, default the current folder: the folder of the
Markdown file the output goes to). A teacher's reward (stage sft) is marked "(teacher)".
Standard library only; a missing field prints as "-".
"""
import json
import os
import sys


def cell(record, key, digits=2):
    value = record.get(key)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    run = argv[1]
    base = argv[2] if len(argv) == 3 else "."
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        sys.stderr.write(f"learning_steps: {path} not found: give a training run's folder\n")
        return 2
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.stderr.write(f"learning_steps: {path}:{number} is not JSON ({e}); skipped\n")
    print("| step | stage | episodes (teacher) | reward mean | pass rate | faster than compile | kept | loss | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in records:
        episodes = f"{cell(r, 'episodes')} ({cell(r, 'teacher_episodes')})"
        reward = cell(r, "reward_mean")
        if reward == "-" and r.get("teacher_reward_mean") is not None:
            reward = cell(r, "teacher_reward_mean") + " (teacher)"
        print(f"| {cell(r, 'step')} | {cell(r, 'stage')} | {episodes} | {reward} | "
              f"{cell(r, 'pass_rate')} | {cell(r, 'faster_than_compile_rate')} | {cell(r, 'kept')} | "
              f"{cell(r, 'loss', 4)} | {cell(r, 'step_seconds', 1)} |")
    ppo = [r for r in records if r.get("stage") == "ppo" and r.get("reward_mean") is not None]
    print()
    if len(ppo) >= 2:
        first, last = ppo[0]["reward_mean"], ppo[-1]["reward_mean"]
        verdict = "below the first: collapse" if last < first else "not below the first"
        print(f"PPO: reward mean {first:.2f} at its first step, {last:.2f} at its last ({verdict}).")
    else:
        print(f"PPO: {len(ppo)} step(s) with a reward: no collapse check.")
    for name in ("reward", "rates"):
        plot = os.path.join(run, "plots", name + ".svg")
        if os.path.isfile(plot):
            print(f"\n![{name} per step]({os.path.relpath(plot, base)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

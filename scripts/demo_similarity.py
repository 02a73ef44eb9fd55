#!/usr/bin/env python3
"""How close an eval run's final solutions are to the demonstrations (issue 18's copy check).

    scripts/demo_similarity.py EVAL_RUN SOLUTIONS_DIR

For each task of EVAL_RUN (a `cuda-agent eval` output folder: episodes/<id>/workspace/model_new.py
and results/<id>.json) whose reference solution exists in SOLUTIONS_DIR (<id>/model_new.py or
<id>.py), prints the reward and the similarity of the final model_new.py to the reference:
difflib's ratio, 2*matches/(len a + len b) over characters, 1.0 for an identical file (a
normalised edit-distance figure). Then the mean, and how many are verbatim copies (ratio >= 0.98)
among those that passed. Standard library only.
"""
import difflib
import json
import os
import sys


def reference(solutions, task):
    for path in (os.path.join(solutions, task, "model_new.py"), os.path.join(solutions, task + ".py")):
        if os.path.isfile(path):
            return path
    return None


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    run, solutions = argv[1], argv[2]
    episodes = os.path.join(run, "episodes")
    if not os.path.isdir(episodes):
        sys.stderr.write(f"demo_similarity: {run} has no episodes/ folder: give a `cuda-agent eval` output folder\n")
        return 2
    rows = []
    for task in sorted(os.listdir(episodes)):
        ref = reference(solutions, task)
        if ref is None:
            continue
        final = os.path.join(episodes, task, "workspace", "model_new.py")
        text = open(final, encoding="utf-8", errors="replace").read() if os.path.isfile(final) else ""
        ref_text = open(ref, encoding="utf-8", errors="replace").read()
        ratio = difflib.SequenceMatcher(None, text, ref_text, autojunk=False).ratio()
        result = os.path.join(run, "results", task + ".json")
        reward = json.load(open(result)).get("reward") if os.path.isfile(result) else None
        rows.append((task, reward, ratio))
    print("| task | reward | similarity to the demonstration |")
    print("|---|---|---|")
    for task, reward, ratio in rows:
        print(f"| {task} | {reward if reward is not None else '-'} | {ratio:.3f} |")
    if not rows:
        print("\nno task of this run has a reference solution in", solutions)
        return 0
    passed = [r for r in rows if isinstance(r[1], (int, float)) and r[1] > 0]
    copies = [r for r in passed if r[2] >= 0.98]
    print(f"\nmean similarity {sum(r[2] for r in rows) / len(rows):.3f} over {len(rows)} tasks; "
          f"{len(copies)} of the {len(passed)} that passed are verbatim copies (similarity >= 0.98)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""The learning report's headline: base model against final checkpoint, per split.

    scripts/learning_summary.py REPORT_DIR

REPORT_DIR holds the eval runs {base,final}-{train,heldout}/ that scripts/learning_report.sh
wrote (each with report.json). Prints a markdown table: tasks passed, mean reward and faster
than torch.compile, for each model on each split; a run that is missing is named as such.
"""
import json
import os
import sys


def overall(folder):
    path = os.path.join(folder, "report.json")
    if not os.path.isfile(path):
        return None
    return json.load(open(path)).get("metrics", {}).get("overall")


def cell(m):
    if m is None:
        return "not run (see its .log)"
    return (f"{m.get('passed', 0)}/{m.get('tasks', 0)} pass, reward {m.get('mean_reward', -1.0):+.2f}, "
            f"{m.get('faster_than_compile', 0)} faster than torch.compile")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = argv[1]
    print("| tasks | base model | final checkpoint |")
    print("|---|---|---|")
    for split in ("train", "heldout"):
        base = overall(os.path.join(out, f"base-{split}"))
        final = overall(os.path.join(out, f"final-{split}"))
        name = "training" if split == "train" else "held-out"
        print(f"| {name} | {cell(base)} | {cell(final)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env bash
# The learning quickstart's report (issue 18): the base model and a training run's final
# checkpoint, each evaluated with agent episodes on the training tasks and on the held-out tasks at
# the run's rollout temperature, side by side (`cuda-agent bench compare`), and how close the
# final solutions are to the demonstrations (scripts/demo_similarity.py).
#
#   scripts/learning_report.sh RUN_DIR [TRAIN_SPLIT [HELDOUT_SPLIT]]
#       defaults: data/learning/train data/learning/heldout; needs the GPU (eval scores on it)
#
# Writes RUN_DIR/report/{base,final}-{train,heldout}/ (eval runs) and RUN_DIR/report/report.md
# (the run step by step with its plots, scripts/learning_steps.py; then base against final).
# Environment: CUDA_AGENT_BUILD (default build), SOLUTIONS (default data/core/solutions),
# EPISODES_AT_ONCE (default 4: eval --episodes-per-gpu, the quickstart's concurrent episodes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
run=$1
train=${2:-data/learning/train}
heldout=${3:-data/learning/heldout}
bin=${CUDA_AGENT_BUILD:-build}/cuda-agent
solutions=${SOLUTIONS:-data/core/solutions}
cfg=$run/config.resolved.yaml
[ -f "$cfg" ] || { echo "learning_report: $cfg not found: give a training run's folder" >&2; exit 2; }
# The resolved config is the trainer's own YAML: one key a line, strings quoted.
key() { sed -n "s/^ *$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$cfg" | head -1; }
actor=$(key actor); temperature=$(key temperature); max_new=$(key max_new_tokens); max_turns=$(key max_turns)
sampling="temperature=$temperature&max_new_tokens=$max_new"
out=$run/report
mkdir -p "$out"
for split in train heldout; do
  folder=$train; [ $split = heldout ] && folder=$heldout
  "$bin" eval --split "$folder" --policy "local:$actor?$sampling&device=cuda" --max-turns "$max_turns" \
    --episodes-per-gpu "${EPISODES_AT_ONCE:-4}" --output "$out/base-$split" > "$out/base-$split.log" 2>&1 || true
  "$bin" eval --split "$folder" --checkpoint "$run?$sampling" --max-turns "$max_turns" \
    --episodes-per-gpu "${EPISODES_AT_ONCE:-4}" --output "$out/final-$split" > "$out/final-$split.log" 2>&1 || true
done
{
  echo "# Learning report: $run"
  echo
  echo "Base model \`$actor\` against the run's final checkpoint, agent episodes at temperature $temperature"
  echo "(max_new_tokens $max_new, max_turns $max_turns), one episode a task."
  echo
  python3 scripts/learning_summary.py "$out" 2>&1 || true
  echo; echo "## The run, step by step"; echo
  python3 scripts/learning_steps.py "$run" "$out" 2>&1 || true
  for split in train heldout; do
    echo; echo "## ${split} tasks"; echo
    "$bin" bench compare "$out/base-$split" "$out/final-$split" 2>&1 || echo "(compare failed: see $out/*-$split.log)"
    echo; echo "Final solutions against the demonstrations:"; echo
    python3 scripts/demo_similarity.py "$out/final-$split" "$solutions" 2>&1 || true
  done
} > "$out/report.md"
cat "$out/report.md"

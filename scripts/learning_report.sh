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
# EPISODES_AT_ONCE (eval --episodes-per-gpu of each evaluation; default 3), REPORT_AT_ONCE (default
# 1: the four evaluations overlap, base and final on the training tasks beside the base model on
# the held-out ones, then the final checkpoint on those; 0: one after
# another, 4 episodes at once each). The GPU's lock orders every evaluation either way; overlapping
# them keeps it busy while models load and episodes generate. The base model's evaluations and the
# held-out ones time baselines only where a solution needs them (eval --baselines lazy): the base
# model writes none, and the training tasks' are cached by the run. REPORT_MODELS (default all):
# base runs the base model's two evaluations alone and writes no report (scripts/learning_run.sh
# starts it beside the training); final runs the final checkpoint's two (and a base one that did
# not finish), then the report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
models=${REPORT_MODELS:-all}
case "$models" in all | base | final) ;; *) echo "learning_report: REPORT_MODELS is '$models': give all, base or final" >&2; exit 2 ;; esac
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
# The base model decodes as the run's rollouts did (the checkpoint's spec carries it already).
[ "$(key batch_engine)" = true ] && base_engine="&batch_engine=1" || base_engine=""
out=$run/report
mkdir -p "$out"
# evaluate MODEL SPLIT: the base model or the final checkpoint on the training or held-out tasks;
# MODEL-SPLIT.done marks one that ran to its end.
evaluate() {
  local folder=$train model baselines=first
  [ "$2" = heldout ] && folder=$heldout
  { [ "$1" = base ] || [ "$2" = heldout ]; } && baselines=lazy
  if [ "$1" = base ]; then model=(--policy "local:$actor?$sampling&device=cuda$base_engine"); else model=(--checkpoint "$run?$sampling"); fi
  rm -f "$out/$1-$2.done"
  "$bin" eval --split "$folder" "${model[@]}" --max-turns "$max_turns" --episodes-per-gpu "$at_once" \
    --baselines "$baselines" --output "$out/$1-$2" > "$out/$1-$2.log" 2>&1 || true
  touch "$out/$1-$2.done"
}
start=$SECONDS
if [ "$models" = base ]; then
  at_once=${EPISODES_AT_ONCE:-3}
  evaluate base heldout &
  h=$!
  evaluate base train
  wait $h
  echo "learning_report: the base model's evaluations took $((SECONDS - start)) s" >&2
  exit 0
elif [ "$models" = final ]; then
  at_once=${EPISODES_AT_ONCE:-3}
  evaluate final train &
  a=$!
  evaluate final heldout
  wait $a
  for split in train heldout; do [ -f "$out/base-$split.done" ] || evaluate base $split; done
elif [ "${REPORT_AT_ONCE:-1}" = 1 ]; then
  at_once=${EPISODES_AT_ONCE:-3}
  # The training tasks' baselines are in the scoring cache from the run; the held-out ones' are
  # timed where a solution needs them.
  evaluate base train & a=$!
  evaluate final train & b=$!
  evaluate base heldout
  evaluate final heldout
  wait $a $b
else
  at_once=${EPISODES_AT_ONCE:-4}
  for split in train heldout; do evaluate base $split; evaluate final $split; done
fi
echo "learning_report: the evaluations ($models) took $((SECONDS - start)) s" >&2
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

#!/usr/bin/env bash
# The main job: install what is missing, build, and run the learning quickstart
# (configs/learning.yaml): SmolLM2-135M-Instruct (fetched by setup.sh) warms up on the reference
# solutions of ten data/core tasks played as agent episodes, then RFT on its own samples, value
# pretraining and agentic PPO, on this machine's GPU; and the report (scripts/learning_run.sh,
# scripts/learning_report.sh): the base model against the final checkpoint on the ten training
# tasks and four held-out ones, the base model's evaluations beside the training.
# It writes runs/learning-<time>/: metrics.jsonl, plots/, rollouts/, checkpoints/, report/report.md.
#
#   scripts/run.sh                 # extra arguments go to `cuda-agent train` (they come last and win,
#                                  # e.g. --set ppo.steps=5 or --set run.output_dir=runs/mine)
#   scripts/run.sh --config configs/quickstart.yaml   # the plain quickstart: every stage of the
#                                  # paper's recipe at toy scale, no demonstrations (no report)
#   scripts/run.sh --device cpu    # on a machine without a GPU: the same run on the CPU (float32;
#                                  # minutes per step; no report: scoring needs a GPU)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '[run] %s\n' "$*" >&2; }

# The GPU first: without one, say so before installing or building anything (setup takes about
# half an hour on a fresh machine). `cuda-agent train` checks again, thoroughly, once built.
has_gpu() {
  compgen -G '/dev/nvidia[0-9]*' >/dev/null && return
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}
on_cpu=0
prev=""
for a in "$@"; do
  { [ "$prev" = --device ] && [ "$a" = cpu ]; } || [ "$a" = --device=cpu ] && on_cpu=1
  prev=$a
done
if [ "$on_cpu" = 0 ] && ! has_gpu; then
  say "no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidia0): the main job trains"
  say "on a GPU. Nothing was installed or built."
  say "What works here: scripts/test.sh (installs, builds, runs the CPU tests), then"
  say "  build/cuda-agent verify --device cpu | compile | generate | serve | solve --device cpu |"
  say "  eval --device cpu (verified only, nothing timed) | train --device cpu (float32, slow) | doctor"
  say "or this quickstart on the CPU, at minutes per step: scripts/run.sh --device cpu"
  exit 2
fi
scripts/setup.sh
build_dir=${CUDA_AGENT_BUILD:-build}
# The config (--config, once) and the run's folder (a later --set run.output_dir wins) as
# `cuda-agent train` will see them; the report needs both.
config=configs/learning.yaml
run_dir=""
args=()
prev=""
for a in "$@"; do
  if [ "$prev" = --config ]; then config=$a; prev=""; continue; fi
  case "$a" in
    --config) prev=$a; continue ;;
    --config=*) config=${a#--config=}; prev=""; continue ;;
  esac
  [ "$prev" = --set ] && case "$a" in run.output_dir=*) run_dir=${a#run.output_dir=} ;; esac
  args+=("$a")
  prev=$a
done
if [ -z "$run_dir" ]; then
  run_dir="runs/$(basename "$config" .yaml)-$(date +%Y%m%d-%H%M%S)"
  args=(--set "run.output_dir=$run_dir" "${args[@]}")
fi
if [ "$on_cpu" = 1 ] || [ "$config" != configs/learning.yaml ]; then
  "$build_dir/cuda-agent" train --config "$config" "${args[@]}"
  say "done: $run_dir (no report: it scores on the GPU, for configs/learning.yaml)"
  exit 0
fi
# The run, with the report's evaluations of the base model beside it, then the final checkpoint's
# and the report (scripts/learning_run.sh, scripts/learning_report.sh).
CUDA_AGENT_BUILD=$build_dir scripts/learning_run.sh "$run_dir" "${args[@]}"
python3 scripts/learning_summary.py "$run_dir/report" >&2 || true
say "done: $run_dir/report/report.md (the run step by step, each task, and how close the final solutions are to"
say "the demonstrations)"

#!/usr/bin/env bash
# The learning quickstart's run and its report, overlapped on one GPU (issue 18): `cuda-agent
# train` on configs/learning.yaml, and beside it the report's evaluations of the base model
# (scripts/learning_report.sh with REPORT_MODELS=base), which need no trained weights and time no
# baselines (eval --baselines lazy: the base model writes no solution that needs them), both at
# once. The training runs with --shared-gpu, so that its learner's GPU
# work keeps out of those evaluations' timed runs. Once the run ends, the final checkpoint's two
# evaluations (REPORT_MODELS=final) and the report.
#
#   scripts/learning_run.sh RUN_DIR [TRAIN ARGS...]
#       RUN_DIR: the run's folder (run.output_dir); TRAIN ARGS go to `cuda-agent train` after
#       --config configs/learning.yaml (LEARNING_CONFIG overrides it) and before run.output_dir.
#
# Environment: CUDA_AGENT_BUILD (default build); REPORT_BESIDE (default 1; 0: the base model's
# evaluations after the run, as learning_report.sh alone does). Exit status: the training's when
# it fails (no report then), else 0; the report is RUN_DIR/report/report.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
run=$1; shift
build=${CUDA_AGENT_BUILD:-build}
config=${LEARNING_CONFIG:-configs/learning.yaml}
say() { printf '[learning] %s\n' "$*" >&2; }
start=$SECONDS
train_pid="" base_pid=""
# A background job of a script ignores Ctrl-C: pass a stop on to both (train stops at a safe point).
stop() {
  [ -z "$train_pid" ] || kill -TERM "$train_pid" 2>/dev/null || true
  [ -z "$base_pid" ] || kill -TERM -- "-$base_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  exit 130
}
trap stop INT TERM

beside=${REPORT_BESIDE:-1}
train_args=(train --config "$config" "$@" --set "run.output_dir=$run")
[ "$beside" = 1 ] && train_args+=(--shared-gpu)
"$build/cuda-agent" "${train_args[@]}" &
train_pid=$!
if [ "$beside" = 1 ]; then
  # The report reads the run's resolved config, written before the first step.
  while kill -0 "$train_pid" 2>/dev/null && [ ! -f "$run/config.resolved.yaml" ]; do sleep 1; done
  if [ -f "$run/config.resolved.yaml" ]; then
    say "the base model's evaluations start beside the training (scripts/learning_report.sh, REPORT_MODELS=base)"
    # In a process group of its own, so that a stop reaches its evaluations.
    setsid env REPORT_MODELS=base CUDA_AGENT_BUILD="$build" \
      scripts/learning_report.sh "$run" > /dev/null 2>&1 &
    base_pid=$!
  fi
fi
rc=0
wait "$train_pid" || rc=$?
train_pid=""
say "training ended (rc $rc) after $((SECONDS - start)) s"
if [ "$rc" != 0 ]; then
  [ -z "$base_pid" ] || kill -TERM -- "-$base_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  exit "$rc"
fi
if [ -n "$base_pid" ]; then
  wait "$base_pid" || true
  base_pid=""
  say "the base model's evaluations done after $((SECONDS - start)) s"
fi
say "the report: the final checkpoint's evaluations (scripts/learning_report.sh)"
REPORT_MODELS=$([ "$beside" = 1 ] && echo final || echo all) CUDA_AGENT_BUILD=$build \
  scripts/learning_report.sh "$run" > /dev/null
say "run and report took $((SECONDS - start)) s: $run/report/report.md"

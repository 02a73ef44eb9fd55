#!/usr/bin/env bash
# The main job: install what is missing, build, and run configs/quickstart.yaml: the whole
# training recipe (single-turn warm-up, RFT, value pretraining, agentic PPO) at toy scale, with
# SmolLM2-135M-Instruct (fetched by setup.sh) on the bundled core split, on this machine's GPU.
# It writes runs/quickstart-<time>/: metrics.jsonl, plots/, rollouts/, checkpoints/.
#
#   scripts/run.sh                 # extra arguments go to `cuda-agent train` (they come last and win,
#                                  # e.g. --set ppo.steps=5 or --set run.output_dir=runs/mine)
#   scripts/run.sh --device cpu    # on a machine without a GPU: the same run on the CPU (float32;
#                                  # minutes per step)
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
exec "$build_dir/cuda-agent" train --config configs/quickstart.yaml \
  --set "run.output_dir=runs/quickstart-$(date +%Y%m%d-%H%M%S)" "$@"

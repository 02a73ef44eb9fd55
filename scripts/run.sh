#!/usr/bin/env bash
# The main job: install what is missing, build, and run configs/quickstart.yaml: the whole
# training recipe (single-turn warm-up, RFT, value pretraining, agentic PPO) at toy scale, with
# SmolLM2-135M-Instruct (fetched by setup.sh) on the bundled core split, on this machine's GPU.
# It writes runs/quickstart-<time>/: metrics.jsonl, plots/, rollouts/, checkpoints/.
#
#   scripts/run.sh                 # extra arguments go to `cuda-agent train` (they come last and win,
#                                  # e.g. --set ppo.steps=5 or --set run.output_dir=runs/mine)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
build_dir=${CUDA_AGENT_BUILD:-build}
exec "$build_dir/cuda-agent" train --config configs/quickstart.yaml \
  --set "run.output_dir=runs/quickstart-$(date +%Y%m%d-%H%M%S)" "$@"

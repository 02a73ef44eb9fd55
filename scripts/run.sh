#!/usr/bin/env bash
# The main job: install what is missing, build, and score the bundled demo split's reference
# solutions on this machine's GPU(s), printing the result table.
#
#   scripts/run.sh                 # extra arguments go to `cuda-agent bench`
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
build_dir=${CUDA_AGENT_BUILD:-build}
exec "$build_dir/cuda-agent" bench --split data/demo --solutions data/demo/solutions "$@"

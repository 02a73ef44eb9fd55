#!/usr/bin/env bash
# The sandbox benchmarks of docs/benchmarks.md, on a GPU machine, side by side in one run.
#   scripts/bench_sandbox.sh BUILD_DIR OUT_DIR
# 1. NVRTC compile latency (10 fresh processes) against one load_inline build of the same kernel.
# 2. One full evaluation of a level-1 task with cached baselines (wall time, phase split).
# 3. Timing noise: the coefficient of variation of the candidate's median over 10 profiles.
set -euo pipefail
build=${1:-build}
out=${2:-bench-out}
mkdir -p "$out"
bin="$build/cuda-agent"
py=$(grep -E '^CUDA_AGENT_PYTHON:' "$build/CMakeCache.txt" | cut -d= -f2)
export CUDA_AGENT_CACHE_DIR=${CUDA_AGENT_CACHE_DIR:-$out/cache}

echo "== 1. compile latency" >&2
: > "$out/nvrtc.txt"
for i in $(seq 10); do "$bin" compile scripts/bench/candidate_kernel.cu | head -1 >> "$out/nvrtc.txt"; done
if [ -z "${SKIP_LOAD_INLINE:-}" ]; then
  "$py" scripts/bench/load_inline_compile.py scripts/bench/candidate_kernel.cu > "$out/load_inline.json"
fi

echo "== 2. full evaluation with cached baselines" >&2
task=data/demo/tasks/softmax_rows/model.py
sol=data/demo/solutions/softmax_rows/model_new.py
"$bin" evaluate --task $task --solution $sol --output "$out/eval_first.json" > /dev/null || true
for i in 1 2 3; do
  /usr/bin/time -f "%e" -o "$out/eval_wall_$i.txt" "$bin" evaluate --task $task --solution $sol \
    --output "$out/eval_cached_$i.json" > /dev/null || true
done

echo "== 3. timing noise" >&2
for i in $(seq 10); do
  "$bin" profile --task tests/data/tasks/copy_large/model.py --solution tests/data/solutions/copy_ok/model_new.py \
    --output "$out/noise_copy_$i.json" > /dev/null || true
  "$bin" profile --task $task --solution $sol --output "$out/noise_softmax_$i.json" > /dev/null || true
done

"$py" - "$out" <<'PY'
import glob, json, re, statistics, sys
out = sys.argv[1]
nv = [float(re.search(r"in ([0-9.]+) s", l).group(1)) for l in open(f"{out}/nvrtc.txt") if "in " in l]
import os
li = json.load(open(f"{out}/load_inline.json"))["load_inline_seconds"] if os.path.exists(f"{out}/load_inline.json") else None
walls = [float(open(f).read().strip().splitlines()[-1]) for f in sorted(glob.glob(f"{out}/eval_wall_*.txt"))]
cached = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/eval_cached_*.json"))]
def cv(name):
    meds = [json.load(open(f))["timings"]["candidate"]["median_ms"] for f in sorted(glob.glob(f"{out}/noise_{name}_*.json"))]
    return {"medians_ms": meds, "mean_ms": statistics.mean(meds), "cv": statistics.pstdev(meds) / statistics.mean(meds)}
summary = {
    "nvrtc_seconds": nv, "nvrtc_median_s": statistics.median(nv), "load_inline_s": li,
    "load_inline_over_nvrtc": li / statistics.median(nv) if li else None,
    "eval_wall_s": walls, "eval_cached_baselines": [c["timings"]["baselines_cached"] for c in cached],
    "eval_phase_seconds": cached[-1]["phase_seconds"], "eval_worker_seconds": cached[-1]["worker_seconds"],
    "eval_reward": [c["reward"] for c in cached],
    "noise_copy_large": cv("copy"), "noise_softmax_rows": cv("softmax"),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY

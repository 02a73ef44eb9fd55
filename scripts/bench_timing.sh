#!/usr/bin/env bash
# The timing benchmarks of docs/benchmarks.md (issue 17), on a GPU machine, in one go:
#   scripts/bench_timing.sh BUILD_DIR OUT_DIR
# 1. ca-sandbox-bench launch: host microseconds per runtime launch against torch.add, same process.
# 2. ca-sandbox-bench timer: the sandbox's timer against KernelBench-style events (same process).
# 3. One profile per size of the add task (2^14 .. 2^26 floats) and of the 1 GiB copy with their
#    test solutions: eager against the candidate, each with its CUPTI kernel time.
set -uo pipefail
build=${1:-build}
out=${2:-timing-out}
mkdir -p "$out"
bin="$build/cuda-agent"
"$build/ca-sandbox-bench" launch > "$out/launch.json" 2> "$out/launch.err"; echo "launch: exit $?"
"$build/ca-sandbox-bench" timer > "$out/timer.json" 2> "$out/timer.err"; echo "timer: exit $?"
tasks=$(mktemp -d)
for p in 14 20 24 26; do
  mkdir -p "$tasks/add_2e$p"
  sed "s/^n = 1 << 22$/n = 1 << $p/" tests/data/tasks/add/model.py > "$tasks/add_2e$p/model.py"
  "$bin" profile --task "$tasks/add_2e$p/model.py" --solution tests/data/solutions/add_ok/model_new.py \
    --set sandbox.profile_compile=false --output "$out/profile_add_2e$p.json" > /dev/null 2>> "$out/profile.err"
done
"$bin" profile --task tests/data/tasks/copy_large/model.py --solution tests/data/solutions/copy_ok/model_new.py \
  --set sandbox.profile_compile=false --output "$out/profile_copy_large.json" > /dev/null 2>> "$out/profile.err"
# What the candidate's process costs: the smallest add again, unconfined, and without the checks.
for v in "confine=off" "integrity_checks=false" "record_kernels=false"; do
  "$bin" profile --task "$tasks/add_2e14/model.py" --solution tests/data/solutions/add_ok/model_new.py \
    --set sandbox.profile_compile=false --set "sandbox.$v" --output "$out/profile_add_2e14_${v%%=*}.json" \
    > /dev/null 2>> "$out/profile.err"
done
rm -rf "$tasks"
py=$(sed -n 's/^CUDA_AGENT_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
"${py:-python3}" - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for name in ("launch", "timer"):
    p = f"{out}/{name}.json"
    if os.path.exists(p) and os.path.getsize(p):
        d = json.load(open(p)); d.pop("device", None)
        print(name, json.dumps(d, indent=1))
print("task | eager ms | candidate ms | candidate / eager | eager GPU ms | candidate GPU ms | candidate host ms | category")
for p in sorted(glob.glob(f"{out}/profile_*.json")):
    r = json.load(open(p)); t = r.get("timings") or {}
    e, c = (t.get("eager") or {}).get("median_ms"), (t.get("candidate") or {}).get("median_ms")
    ek, ck = (t.get("eager") or {}).get("gpu_kernel_ms"), (t.get("candidate") or {}).get("gpu_kernel_ms")
    host = (r.get("timing") or {}).get("candidate_host_median_ms")
    ratio = c / e if e and c else None
    print(os.path.basename(p)[8:-5], e, c, ratio, ek, ck, host, r.get("category"), sep=" | ")
PY

#!/usr/bin/env bash
# On a GPU host: builds scripts/slice_probe.cu and runs the watch alone, then beside each kind of
# another process's GPU work (docs/benchmarks.md section 20). Prints one line a case.
set -uo pipefail
cd "$(dirname "$0")"
probe=/tmp/slice_probe
nvcc -O2 -arch=sm_90 -o $probe slice_probe.cu -lcuda || exit 1
nvidia-smi --query-gpu=name,compute_mode --format=csv,noheader
nvidia-smi compute-policy -l 2>&1 | grep -i timeslice
$probe watch 1000 alone
$probe watch 0 alone-nosleep
for kind in spin sleep wide wait copy h2d; do
  $probe hog 6000 $kind & hog=$!
  sleep 0.5
  $probe watch 1000 $kind nvml
  kill $hog 2>/dev/null; wait $hog 2>/dev/null
done

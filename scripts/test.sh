#!/usr/bin/env bash
# Installs what is missing, builds, and runs the tests: CPU tests everywhere, GPU tests (ctest
# label "gpu") where a GPU is present; without one they skip themselves and say why.
#
#   scripts/test.sh              # all tests
#   scripts/test.sh -L cpu       # extra arguments go to ctest
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
build_dir=${CUDA_AGENT_BUILD:-build}
export CUDA_AGENT_CACHE_DIR=${CUDA_AGENT_CACHE_DIR:-$root/$build_dir/test-cache}
# Tests that run Python scripts use the interpreter the build embeds (its .venv has the oracles).
py=$(sed -n 's/^CUDA_AGENT_PYTHON:FILEPATH=//p' "$build_dir/CMakeCache.txt")
[ -n "$py" ] && export CUDA_AGENT_PYTHON=${CUDA_AGENT_PYTHON:-$py}
# The real model's tests (tokenizer, weights, generate/serve) use the file setup.sh fetched.
smollm2="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$smollm2" ] && export CUDA_AGENT_SMOLLM2_GGUF=${CUDA_AGENT_SMOLLM2_GGUF:-$smollm2}
log="$build_dir/ctest.log"
# Every test cleans up after itself: the tests get a fresh TMPDIR, and what is left in it fails
# the run, but for what is meant to stay there: the GPU lock files and torch.compile's own cache
# (torchinductor_<user>, which the judge's baselines use as any torch program does).
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cuda-agent-tests.XXXXXX")
before=$(mktemp "$tmp.before.XXXXXX")  # and what appears in /tmp itself (a path written out)
find /tmp -mindepth 1 -maxdepth 1 -user "$(id -u)" 2>/dev/null | sort >"$before"
set +e
# Red-team entries that take the whole GPU's memory (oom_hog_*) run alone, before the rest (without
# a GPU they skip). The main run comes last so that its summary is the log's last one.
TMPDIR="$tmp" ctest --test-dir "$build_dir" --output-on-failure --timeout 900 -R oom_hog 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
TMPDIR="$tmp" ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 900 -E oom_hog "$@" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
set -e
left=$(find "$tmp" -mindepth 1 -maxdepth 1 ! -name '*.lock' ! -name cuda-agent-locks ! -name 'torchinductor_*' 2>/dev/null)
if [ -n "$left" ]; then
  echo "[test] the tests left these in their TMPDIR ($tmp); each test must remove what it creates:"
  du -sh $left 2>/dev/null || echo "$left"
  [ "$rc" = 0 ] && rc=1
fi
# A path written out as /tmp escapes TMPDIR: what appeared there meanwhile is listed (not failed:
# on a shared machine something else may have made it).
new_in_tmp=$(find /tmp -mindepth 1 -maxdepth 1 -user "$(id -u)" ! -name '*.lock' ! -name cuda-agent-locks ! -path "$tmp*" 2>/dev/null | sort |
  comm -13 "$before" -)
if [ -n "$new_in_tmp" ]; then
  echo "[test] new in /tmp during the tests (a test that writes to /tmp itself, or something else on this machine):"
  du -sh $new_in_tmp 2>/dev/null || echo "$new_in_tmp"
fi
chmod -R u+rwX "$tmp" 2>/dev/null || true
rm -rf "$tmp" "$before"
skipped=$(grep -c -E '\(Skipped\)' "$log" || true)
if [ "$skipped" != "0" ]; then
  echo "[test] $skipped test(s) skipped. GPU tests skip themselves without a usable GPU; this machine:"
  "$build_dir/cuda-agent" doctor 2>&1 | grep -E '^GPU' || true
fi
exit "$rc"

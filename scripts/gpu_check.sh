#!/usr/bin/env bash
# Everything that needs the GPU host, in one go: build with CMake there, doctor, the GPU tests,
# the demo bench. Logs go to $OUT (or ./gpu-check-out).
#   scripts/gpu_check.sh [tests|bench|all|core|core-cached|agreement|warm|lm|engine|multi|train|train-2gpu|learning|learning-report|ablate|kernelbench|timing|synth|ppo64|precompile|initlock|rate]
# agreement: issue 17's repeatability: the baselines of data/core's solved tasks cached, then
# AGREE_RUNS (default 5) benches of their reference solutions, each a fresh evaluation per task;
# scripts/reward_agreement.py compares their rewards pair by pair and the speedups' CV.
# warm: an evaluation's wall time with cached baselines, judges started per evaluation against
# judges started ahead (sandbox.warm_workers); scripts/eval_wall.py.
# synth: issue 20's target, SYNTH_COUNT (default 300) sampled candidates through every filter,
# against KB_DIR's KernelBench tasks where that folder exists; the funnel and the wall time
# (detached: call it again at once while a run goes on; SYNTH_RESUME when the machine was given
# back in between).
# ppo64: issue 19's PPO step at 64 episodes through the batch engine (detached, as learning).
# precompile: sandbox.compile_before_lock against without, the baselines of ten tasks (below).
# initlock: sandbox.init_before_lock against without, a bench of data/core's solved tasks with
# cached baselines, four evaluations in flight (below).
# rate: issue 19's evaluations a GPU-minute in the steady state (below).
# kernelbench: every task of a KernelBench checkout (KB_DIR, default kb: its level1/ level2/
# level3/ folders and solutions/<id>.py, each the task with `ModelNew = Model` appended), one
# bench per level (KB_LEVELS, default "1 2 3"), provenance warn and no torch.compile baseline, so
# that the run measures whether every task evaluates (docs/benchmarks.md, KernelBench).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# "core" scores the bundled split's reference solutions (data/core) with baselines cached first.
# Logs collect here; one archive of them goes to $OUT (the device tool returns few files; model
# folders written by the benchmarks, *-hf, weights and episode workspaces stay out of it: it must
# stay under the 64 MiB limit).
out=/tmp/gpu-check-out
mkdir -p "$out"
# A call cut at its limit mid-group keeps what that group's tests printed so far: ctest writes
# the log of the group under way as LastTest.log.tmp<random> until the group ends (a group cut
# earlier leaves its own behind: the newest is this one's), kept as `partial.full.log`.
on_exit() {
  case ${what:-} in
    tests | all)
      local log
      log=$(ls -t "$build"/Testing/Temporary/LastTest.log.tmp* 2>/dev/null | head -1)
      [ -n "$log" ] && cp "$log" "$out/partial.full.log"
      ;;
  esac
  [ -n "${OUT:-}" ] && tar czf "$OUT/gpu-check-$what.tgz" --exclude="*-hf" --exclude="*.safetensors" \
    --exclude=workspace -C "$out" . 2>/dev/null
}
trap on_exit EXIT
what=${1:-all}
build=build-gpu
export CUDA_AGENT_CACHE_DIR=${CUDA_AGENT_CACHE_DIR:-/tmp/cuda-agent-cache}
if [ ! -f $build/CMakeCache.txt ]; then
  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDA_AGENT_PYTHON="$(command -v python3)" \
    > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
fi
# The test binaries only where tests run; the libtorch language model's targets exist where
# CMake found libtorch.
has() { ninja -C $build -t query "$1" > /dev/null 2>&1; }
targets="cuda-agent ca-sandbox-bench"
has ca-lm-bench && targets="$targets ca-lm-bench"
if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = multi ]; then
  targets="$targets ca_tests_gpu"
  has ca_tests_policy_gpu && targets="$targets ca_tests_policy_gpu"
fi
# GPU_TEST_TIMEOUT: ctest's limit a test (default 500 s).
# GPU_CHECK_TARGETS: build these alone (a call short of device time: say "cuda-agent ca_tests_gpu").
targets=${GPU_CHECK_TARGETS:-$targets}
# A learning run that goes on from an earlier call uses this build's binaries (the judges it
# starts run them): no rebuild under it.
if [[ " learning ablate synth ppo64 " == *" $what "* ]] && [ -f "$out/$what.pid" ] && kill -0 "$(cat "$out/$what.pid")" 2>/dev/null; then
  echo "build skipped: the $what run of an earlier call is still going"
else
  ninja -C $build $targets > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
  echo "build ok"
fi
$build/cuda-agent doctor > "$out/doctor.txt" 2>&1; cat "$out/doctor.txt"
export CUDA_AGENT_PYTHON=${CUDA_AGENT_PYTHON:-$(sed -n 's/^CUDA_AGENT_PYTHON:FILEPATH=//p' $build/CMakeCache.txt)}
if [ "$what" = tests ] || [ "$what" = all ]; then
  # Each group's log also goes to $OUT as soon as the group ends, so that a call cut at its limit
  # still brings back what ran.
  group() {
    local name=$1; shift
    (cd $build && ctest -L gpu "$@" --output-on-failure --timeout ${GPU_TEST_TIMEOUT:-500}) > "$out/$name.log" 2>&1
    # What every test printed, passed ones included (their figures: ctest shows output only on
    # failure); it goes into the archive.
    cp $build/Testing/Temporary/LastTest.log "$out/$name.full.log" 2>/dev/null
    [ -n "${OUT:-}" ] && cp "$out/$name.log" "$OUT/" 2>/dev/null
    return 0
  }
  rm -f "$out"/gpu_tests*.log "$out/partial.full.log"  # an earlier call's, on a warm machine (the .full.log ones too)
  # GPU_TESTS_FIRST: a ctest regex run alone before the groups (what a call short of device time
  # must see first); those tests run again in their group.
  [ -n "${GPU_TESTS_FIRST:-}" ] && group gpu_tests_first -R "$GPU_TESTS_FIRST"
  # Functional tests in parallel; the timing-sensitive ones and those that need most of the
  # GPU's memory alone afterwards.
  group gpu_tests -E 'Timer|Baselines|LargeTask|oom_hog|hidden_' -j8
  # Red-team entries that take the whole GPU's memory, or keep a kernel of their own on it between
  # their forwards (which would stretch every evaluation beside them): alone, always.
  group gpu_tests_alone -R 'oom_hog|hidden_'
  # TESTS_TIMING=0: the functional group alone (a change that leaves the timer alone).
  [ "${TESTS_TIMING:-1}" = 1 ] && group gpu_tests_timing -R 'Timer|Baselines|LargeTask'
  grep -E "tests passed|Failed|\*\*\*|Passed|Skipped" "$out/gpu_tests_first.log" "$out/gpu_tests.log" \
    "$out/gpu_tests_alone.log" "$out/gpu_tests_timing.log" 2>/dev/null | tail -40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  $build/cuda-agent bench --split data/demo --solutions data/demo/solutions --output "$out/demo-bench" \
    > "$out/demo_bench.txt" 2> "$out/demo_bench.err"
  cat "$out/demo_bench.txt"; tail -5 "$out/demo_bench.err"
fi
# The tasks of data/core that have a reference solution, as a split of their own in /tmp/core-solved.
make_core_solved() {
  sub=/tmp/core-solved; rm -rf $sub; mkdir -p $sub; ln -s "$root/data/core/tasks" $sub/tasks
  { echo "name: core-solved"; echo "tasks:"
    for d in data/core/solutions/*/; do
      id=$(basename "$d")
      echo "  - id: $id"; echo "    path: tasks/$id/model.py"
      echo "    level: $(grep -A2 "id: $id\$" data/core/split.yaml | sed -n 's/ *level: //p')"
    done; } > $sub/split.yaml
}
if [ "$what" = multi ]; then
  # A host with 2+ GPUs (issue 8): the learner's data parallelism over NCCL against one process,
  # then the bench rate with cached baselines on GPU 0 alone and on every GPU.
  (cd $build && ctest -R DataParallelGpu --output-on-failure --timeout 600) > "$out/dp_gpu.log" 2>&1
  grep -E "tests passed|Failed|Passed|Skipped" "$out/dp_gpu.log"
  make_core_solved
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
  timeout "${CORE_BASELINES_TIMEOUT:-3000}" $build/cuda-agent baselines --split $sub --gpus "$gpus" --output "$out/multi-baselines" > "$out/multi_baselines.txt" 2>&1
  for g in 0 "$gpus"; do
    start=$SECONDS
    timeout "${CORE_BENCH_TIMEOUT:-3000}" $build/cuda-agent bench --split $sub --solutions data/core/solutions --gpus "$g" \
      --output "$out/multi-bench-${g//,/-}" > "$out/multi_bench_${g//,/-}.txt" 2>&1
    echo "bench on GPUs $g: $((SECONDS - start)) s" | tee -a "$out/multi_bench.txt"
  done
fi
if [ "$what" = core-cached ]; then
  # Evaluations per GPU-minute with cached baselines: the tasks that have a reference solution,
  # baselines timed first (their own phase), then the bench alone, each with its wall time.
  make_core_solved
  start=$SECONDS
  # CORE_SKIP_BASELINES=1: the cache came with the call (carried), time the bench alone.
  [ -z "${CORE_SKIP_BASELINES:-}" ] && timeout "${CORE_BASELINES_TIMEOUT:-3000}" $build/cuda-agent baselines --split $sub --output "$out/core-baselines" > "$out/core_baselines.txt" 2>&1
  echo "baselines wall: $((SECONDS - start)) s" | tee -a "$out/core_baselines.txt"; tail -5 "$out/core_baselines.txt"
  start=$SECONDS
  [ "${CORE_BENCH_TIMEOUT:-3000}" != 0 ] && timeout "${CORE_BENCH_TIMEOUT:-3000}" $build/cuda-agent bench --split $sub --solutions data/core/solutions \
    --output "$out/core-bench" > "$out/core_bench.txt" 2> "$out/core_bench.err"
  echo "core bench wall (cached baselines): $((SECONDS - start)) s" | tee -a "$out/core_bench.txt"
  cat "$out/core_bench.txt"; tail -5 "$out/core_bench.err"
  tar czf "$out/baseline-cache.tgz" -C "$CUDA_AGENT_CACHE_DIR" . 2>/dev/null
fi
if [ "$what" = agreement ]; then
  # AGREE_FROM (default 1) numbers the first bench of this call: a second call on the warm
  # machine goes on where the first stopped, and the comparison takes every finished bench.
  # BASELINE_WORKERS (default 2) evaluations share the GPU while the baselines are cached (the
  # timed runs are still one at a time: the GPU lock).
  make_core_solved
  timeout "${CORE_BASELINES_TIMEOUT:-300}" $build/cuda-agent baselines --split $sub --output "$out/agree-baselines" \
    --workers-per-gpu "${BASELINE_WORKERS:-2}" > "$out/agree_baselines.txt" 2>&1
  echo "baselines: exit $?"; tail -3 "$out/agree_baselines.txt"
  first=${AGREE_FROM:-1}
  for i in $(seq "$first" $((first + ${AGREE_RUNS:-5} - 1))); do
    start=$SECONDS
    timeout "${CORE_BENCH_TIMEOUT:-300}" $build/cuda-agent bench --split $sub --solutions data/core/solutions \
      --output "$out/agree-$i" > "$out/agree_$i.txt" 2> "$out/agree_$i.err"
    echo "bench $i: exit $?, $((SECONDS - start)) s"
    # Each finished bench to $OUT at once: a call cut short still brings back what it measured.
    [ -n "${OUT:-}" ] && tar czf "$OUT/agree-$i.tgz" --exclude=workspace -C "$out" "agree-$i"
  done
  dirs=(); for d in "$out"/agree-[0-9]*; do [ -f "$d/summary.json" ] && dirs+=("$d"); done
  python3 scripts/reward_agreement.py "${dirs[@]}" | tee "$out/agreement.md"
fi
if [ "$what" = warm ]; then
  # Evaluation wall with cached baselines (issues 15 and 19): the first WARM_TASKS (default 12)
  # of data/core's solved tasks, eager baselines cached first (no torch.compile: it is not what
  # this measures), then one bench without judges started ahead (sandbox.warm_workers=0) and one
  # with (the default), one evaluation at a time; scripts/eval_wall.py compares them.
  make_core_solved
  head -n $((2 + 3 * ${WARM_TASKS:-12})) $sub/split.yaml > $sub/split.tmp && mv $sub/split.tmp $sub/split.yaml
  nocompile=(--set sandbox.profile_compile=false ${RATE_SET:-})
  timeout "${CORE_BASELINES_TIMEOUT:-300}" $build/cuda-agent baselines --split $sub "${nocompile[@]}" \
    --output "$out/warm-baselines" > "$out/warm_baselines.txt" 2>&1
  for w in 0 2; do
    start=$SECONDS
    timeout "${CORE_BENCH_TIMEOUT:-300}" $build/cuda-agent bench --split $sub --solutions data/core/solutions \
      "${nocompile[@]}" --set sandbox.warm_workers=$w --workers-per-gpu 1 --output "$out/warm-$w" \
      > "$out/warm_$w.txt" 2> "$out/warm_$w.err"
    echo "bench, warm_workers=$w: $((SECONDS - start)) s" | tee -a "$out/warm.txt"
  done
  python3 scripts/eval_wall.py "$out/warm-0" "$out/warm-2" | tee -a "$out/warm.txt"
  # One-shot evaluations (a process of its own each: no judge started ahead), the first filling
  # the cache: section 2's figure.
  for i in 1 2 3 4; do
    $build/cuda-agent evaluate --task tests/data/tasks/add/model.py --solution tests/data/solutions/add_ok/model_new.py \
      --json 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin); print('evaluate $i:', r['category'] or 'pass', \
      'wall %.2f s' % r['wall_seconds'], {k: round(v, 2) for k, v in r['phase_seconds'].items()}, r.get('processes'))" \
      | tee -a "$out/warm.txt"
  done
fi
if [ "$what" = rate ]; then
  # Issue 19's evaluations a GPU-minute in the steady state: data/core's solved tasks, each
  # RATE_REPEATS times (default 3; the copies share the task, so its cached baselines), eager
  # baselines cached first (no torch.compile), then one bench with RATE_WORKERS (default 4)
  # evaluations in flight and the default judges started ahead; scripts/eval_rate.py counts the
  # evaluations that ended after the first RATE_WORKERS (the judges' first start left out).
  make_core_solved
  rate=/tmp/core-rate; rm -rf $rate; mkdir -p $rate/solutions; ln -s "$root/data/core/tasks" $rate/tasks
  { echo "name: core-rate"; echo "tasks:"
    for r in $(seq 1 "${RATE_REPEATS:-3}"); do
      sed -n '3,$p' $sub/split.yaml | sed "s/^  - id: \(.*\)$/  - id: \1-r$r/"
    done; } > $rate/split.yaml
  for d in data/core/solutions/*/; do
    for r in $(seq 1 "${RATE_REPEATS:-3}"); do cp -r "$d" "$rate/solutions/$(basename "$d")-r$r"; done
  done
  nocompile=(--set sandbox.profile_compile=false ${RATE_SET:-})
  timeout "${CORE_BASELINES_TIMEOUT:-300}" $build/cuda-agent baselines --split $sub "${nocompile[@]}" \
    --workers-per-gpu 4 --output "$out/rate-baselines" > "$out/rate_baselines.txt" 2>&1
  start=$SECONDS
  timeout "${RATE_TIMEOUT:-400}" $build/cuda-agent bench --split $rate --solutions $rate/solutions \
    "${nocompile[@]}" --workers-per-gpu "${RATE_WORKERS:-4}" --output "$out/rate" > "$out/rate.txt" 2> "$out/rate.err"
  echo "bench: exit $?, $((SECONDS - start)) s" | tee -a "$out/rate_summary.txt"
  python3 scripts/eval_rate.py "$out/rate" --skip "${RATE_WORKERS:-4}" | tee -a "$out/rate_summary.txt"
  python3 scripts/eval_wall.py "$out/rate" 2>&1 | tail -14 | tee -a "$out/rate_summary.txt"
  # The floor under the tasks' own GPU work: a task of small inputs (tests/data/tasks/add, two
  # vectors of 4M floats) with a correct solution, 12 evaluations one at a time and then 24 with
  # RATE_WORKERS in flight, judges started ahead.
  small=/tmp/add-rate; rm -rf $small; mkdir -p $small/solutions; ln -s "$root/tests/data/tasks" $small/tasks
  { echo "name: add-rate"; echo "tasks:"
    for i in $(seq 1 24); do
      echo "  - id: add-$i"; echo "    path: tasks/add/model.py"; echo "    level: 1"
      cp -r tests/data/solutions/add_ok $small/solutions/add-$i
    done; } > $small/split.yaml
  part() {  # part NAME COUNT: a split of the first COUNT copies
    mkdir -p $small/$1 && ln -s "$root/tests/data/tasks" $small/$1/tasks
    head -n $((2 + 3 * $2)) $small/split.yaml > $small/$1/split.yaml
  }
  part base 1; part one 12
  timeout 120 $build/cuda-agent baselines --split $small/base "${nocompile[@]}" --output "$out/add-baselines" \
    > "$out/add_baselines.txt" 2>&1
  timeout 200 $build/cuda-agent bench --split $small/one --solutions $small/solutions "${nocompile[@]}" \
    --workers-per-gpu 1 --output "$out/add-one" > "$out/add_one.txt" 2> "$out/add_one.err"
  timeout 200 $build/cuda-agent bench --split $small --solutions $small/solutions "${nocompile[@]}" \
    --workers-per-gpu "${RATE_WORKERS:-4}" --output "$out/add-rate" > "$out/add_rate.txt" 2> "$out/add_rate.err"
  python3 scripts/eval_wall.py "$out/add-one" 2>&1 | tail -14 | tee -a "$out/rate_summary.txt"
  python3 scripts/eval_rate.py "$out/add-rate" --skip "${RATE_WORKERS:-4}" | tee -a "$out/rate_summary.txt"
fi
if [ "$what" = lm ]; then
  timeout "${LM_BENCH_TIMEOUT:-3000}" scripts/bench_lm.sh $build "$out/lm-bench" > "$out/lm_bench.md" 2> "$out/lm_bench.err"
  cat "$out/lm_bench.md"; tail -5 "$out/lm_bench.err"
fi
if [ "$what" = train ] || [ "$what" = train-2gpu ]; then
  # Issue 7's GPU check: configs/quickstart.yaml with SmolLM2 (models/ must hold the GGUF: on an
  # offline host copy it there first), every stage, then eval --checkpoint on the run, GPU memory
  # sampled beside it; then the same run with two concurrent episodes (rollout.concurrent_episodes)
  # for the step times side by side. train-2gpu: the quickstart under torchrun, one process per GPU.
  quickstart() {  # quickstart NAME [LAUNCHER...] -- [--set ...]
    local name=$1; shift; local launcher=(); while [ "$1" != -- ]; do launcher+=("$1"); shift; done; shift
    local start=$SECONDS
    timeout "${TRAIN_TIMEOUT:-600}" "${launcher[@]}" $build/cuda-agent train --config configs/quickstart.yaml \
      --set run.output_dir="$out/$name" "$@" > "$out/$name.log" 2>&1
    echo "$name rc $? wall $((SECONDS - start)) s" | tee -a "$out/$name.log"
    grep -E "^\[train\] step" "$out/$name.log" | tail -8
  }
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$out/train_smi_$what.csv" & smi=$!
  if [ "$what" = train ]; then
    quickstart quickstart --
    timeout "${EVAL_TIMEOUT:-300}" $build/cuda-agent eval --checkpoint "$out/quickstart" --split data/demo \
      --gpus "$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)" --output "$out/eval" > "$out/eval.log" 2>&1
    echo "eval rc $?"; grep -E "^- |pass |episode" "$out/eval.log" | head -12
    quickstart quickstart-concurrent2 -- --set rollout.concurrent_episodes=2
  elif [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    quickstart quickstart-2gpu torchrun --standalone --nproc-per-node 2 --no-python --
  fi
  kill $smi
  # The weights and episode workspaces stay behind (the archive must stay small); metrics, plots,
  # trajectories and logs come back.
  find "$out" -name "*.safetensors" -delete
  find "$out" -type d -name workspace -prune -exec rm -rf {} +
fi
# The model comes in parts (a call carries at most 64 MiB): `split -b 49181216 -d` of
# models/SmolLM2-135M-Instruct.Q4_1.gguf into .gpu-cache/m1/ and .gpu-cache/m2/, each carried by
# one of two calls made back to back on the warm machine; the second assembles it here.
gguf=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $gguf ] && compgen -G '.gpu-cache/m*/smol.part*' > /dev/null; then
  parts=$(ls .gpu-cache/m*/smol.part* | sort -t. -k3)
  if [ "$(cat $parts | wc -c)" = 98362432 ]; then mkdir -p models && cat $parts > $gguf && echo "assembled $gguf"; fi
fi
# A run that outlives one device call: started in a session of its own (setsid), so that it runs
# on while the machine stays warm, and the same mode called again finds it and goes on watching it
# (a call ends CALL_LIMIT s, default 600, after this script started; make the next call at once,
# the machine is warm for 30 s). Each call copies the log and `copy_files` (NAME SOURCE pairs,
# into $OUT) every 5 s and when it ends. RESTART=1 starts an ended run again.
#   detached NAME TIMEOUT COMMAND...
detached() {
  local name=$1 limit=$2; shift 2
  local pidfile=$out/$name.pid
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "$name: the run started earlier (pid $(cat "$pidfile")) is still going"
  elif [ -f "$out/$name.rc" ] && [ -z "${RESTART:-}" ]; then
    echo "$name: the run has ended (rc $(cat "$out/$name.rc")); RESTART=1 starts it again"
  else
    rm -f "$out/$name.rc"
    echo "$name: started $(date -u +%FT%TZ)" >> "$out/$name.log"
    setsid bash -c 'start=$(date +%s); name=$1 out=$2 limit=$3; shift 3; timeout "$limit" "$@" >> "$out/$name.log" 2>&1; rc=$?
      echo "$name rc $rc wall $(( $(date +%s) - start )) s" >> "$out/$name.log"; echo $rc > "$out/$name.rc"' \
      _ "$name" "$out" "$limit" "$@" < /dev/null > /dev/null 2>&1 &
    echo $! > "$pidfile"
    echo "$name: run started (pid $(cat "$pidfile"))"
  fi
  copy_detached() {
    [ -n "${OUT:-}" ] || return 0
    cp "$out/$name.log" "$OUT/$name.log" 2>/dev/null
    set -- ${copy_files:-}
    while [ $# -ge 2 ]; do cp "$2" "$OUT/$1" 2>/dev/null; shift 2; done
  }
  until [ -f "$out/$name.rc" ] || [ $(( ${CALL_LIMIT:-600} - SECONDS )) -lt 30 ]; do
    sleep 5; copy_detached
  done
  copy_detached
  if [ -f "$out/$name.rc" ]; then echo "$name: ended, rc $(cat "$out/$name.rc")"
  else echo "$name: still running; call 'scripts/gpu_check.sh $name' again at once to go on watching it"; fi
}
if [ "$what" = learning ]; then
  # Issue 18's learning quickstart as scripts/run.sh runs it: configs/learning.yaml (models/ must
  # hold the SmolLM2 GGUF, as for train) with its report's evaluations of the base model beside the
  # training, then the final checkpoint's and the report (scripts/learning_run.sh), detached
  # (above). Its weights stay on the machine (the archive leaves *.safetensors out), so that
  # `learning-report` in a next call can evaluate the checkpoint again. LEARNING_SET (say
  # --resume) is passed to train when a run starts; REPORT_BESIDE=0 evaluates the base model after
  # the run; TRAIN_TIMEOUT bounds the whole (run and report).
  [ -n "${LEARNING_SET:-}" ] && RESTART=1
  copy_files="learning-metrics.jsonl $out/learning/metrics.jsonl learning-report.md $out/learning/report/report.md"
  detached learning "${TRAIN_TIMEOUT:-7200}" env CUDA_AGENT_BUILD="$build" scripts/learning_run.sh "$out/learning" \
    ${LEARNING_SET:-}
  grep -E "^\[train\] (step|baselines)|^\[learning\]|^learning " "$out/learning.log" | tail -16
fi
if [ "$what" = ablate ]; then
  # Issue 18's ablations at toy scale: `cuda-agent ablate` over configs/learning.yaml and each of
  # configs/ablations/*.yaml, detached (above; a second call of the run itself resumes each
  # variant). ABLATE_SET (say "--set ppo.steps=1") goes to ablate; ABLATE_TIMEOUT bounds it;
  # ABLATE_PARALLEL (default 5, every variant at once) is its --parallel.
  # In parts, when the variants do not fit one session's device time: ABLATE_VARIANTS (say
  # "base,no_rft,no_value_pretraining") trains those alone; ABLATE_RESUME=DIR (the `ablate` folder
  # of an earlier part's archive, carried in) brings the runs of that part, whose metrics the
  # comparison reads (their checkpoints stay behind: the archive has no weights).
  if [ -n "${ABLATE_RESUME:-}" ] && [ ! -d "$out/ablate" ]; then
    mkdir -p "$out/ablate"
    for d in "$ABLATE_RESUME"/*/; do
      [ -f "$d/metrics.jsonl" ] || continue
      mkdir -p "$out/ablate/$(basename "$d")"; cp "$d"/metrics.jsonl "$out/ablate/$(basename "$d")/"
    done
  fi
  variants=(); [ -n "${ABLATE_VARIANTS:-}" ] && variants=(--variants "$ABLATE_VARIANTS")
  copy_files="ablate-comparison.md $out/ablate/comparison.md"
  detached ablate "${ABLATE_TIMEOUT:-7200}" "$build/cuda-agent" ablate --config configs/learning.yaml \
    --output "$out/ablate" --parallel "${ABLATE_PARALLEL:-5}" "${variants[@]}" ${ABLATE_SET:-}
  grep -E "^\[ablate\]|^\[train\] step|^ablate " "$out/ablate.log" | tail -20
fi
if [ "$what" = learning-report ]; then
  # The base model against the learning run's final checkpoint on the training and held-out
  # tasks, and the final solutions' similarity to the demonstrations (scripts/learning_report.sh).
  start=$SECONDS
  CUDA_AGENT_BUILD=$build timeout "${REPORT_TIMEOUT:-560}" scripts/learning_report.sh "$out/learning" \
    > "$out/learning_report.txt" 2>&1
  echo "report rc $? wall $((SECONDS - start)) s"; tail -40 "$out/learning/report/report.md" 2>/dev/null
fi
if [ "$what" = core ]; then
  start=$SECONDS
  timeout "${CORE_BENCH_TIMEOUT:-3000}" $build/cuda-agent bench --split data/core --solutions data/core/solutions --output "$out/core-bench" \
    > "$out/core_bench.txt" 2> "$out/core_bench.err"
  echo "core bench wall: $((SECONDS - start)) s" | tee -a "$out/core_bench.txt"
  cat "$out/core_bench.txt"; tail -5 "$out/core_bench.err"
fi
if [ "$what" = engine ]; then
  # Issue 19's rollout figure: aggregate tokens/s of ROLLOUT_CONCURRENT (default 1 8 32 64 128)
  # concurrent turns (prompt 512, 128 new tokens each), the batched engine against per call (up to
  # ROLLOUT_PER_CALL_MAX, default 64, concurrent turns: the slow path; 0: the engine alone), on
  # SmolLM2-135M's and Qwen2-1.5B's shapes with random bf16 weights (ca-lm-bench's "rollout").
  conc=$(echo "${ROLLOUT_CONCURRENT:-1 8 32 64 128}" | tr ' ' ',')
  # ENGINE_GATHERED=1: each row also times the engine with torch's attention over gathered keys
  # instead of its paged attention kernel (LmOptions::paged_attention), on the same prompts.
  rollout="\"rollout\": {\"concurrent\": [$conc], \"prompt_tokens\": 512, \"new_tokens\": 128, \"per_call_max\": ${ROLLOUT_PER_CALL_MAX:-64}, \"gathered_too\": $([ "${ENGINE_GATHERED:-0}" = 1 ] && echo true || echo false)}"
  echo "{\"device\": \"cuda\", \"dtype\": \"bfloat16\", \"config\": {\"model_type\": \"llama\", \"vocab_size\": 49152,
    \"hidden_size\": 576, \"intermediate_size\": 1536, \"num_hidden_layers\": 30, \"num_attention_heads\": 9,
    \"num_key_value_heads\": 3, \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-5, \"rope_theta\": 100000.0,
    \"tie_word_embeddings\": true}, $rollout}" > "$out/engine-smollm2.json"
  echo "{\"device\": \"cuda\", \"dtype\": \"bfloat16\", \"config\": {\"model_type\": \"qwen2\", \"vocab_size\": 151936,
    \"hidden_size\": 1536, \"intermediate_size\": 8960, \"num_hidden_layers\": 28, \"num_attention_heads\": 12,
    \"num_key_value_heads\": 2, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,
    \"tie_word_embeddings\": true, \"attention_bias\": true}, $rollout}" > "$out/engine-qwen2_1p5b.json"
  # transformers' batched generate on the same weights (saved by ca-lm-bench), at the same batch
  # sizes, prompt and new tokens (greedy, every row exactly new_tokens): the anchor's figure.
  echo "{\"generation\": {\"batches\": [$conc], \"prompt_tokens\": 512, \"new_tokens\": 128, \"repeats\": 1}}" > "$out/engine-hf-spec.json"
  # ENGINE_MODELS picks the shapes (default both); ENGINE_HF=0 leaves transformers out.
  for m in ${ENGINE_MODELS:-smollm2 qwen2_1p5b}; do
    [ "${ENGINE_HF:-1}" = 1 ] && sed -i "s|^{|{\"save_hf\": \"$out/engine-$m-hf\", |" "$out/engine-$m.json"
    # ENGINE_PROFILE=N: every kernel of the run recorded (CUPTI), the N costliest under "kernels".
    [ -n "${ENGINE_PROFILE:-}" ] && sed -i "s|^{|{\"kernel_profile\": $ENGINE_PROFILE, |" "$out/engine-$m.json"
    timeout "${ENGINE_TIMEOUT:-280}" $build/ca-lm-bench "$out/engine-$m.json" > "$out/engine-$m.out.json" 2> "$out/engine-$m.err"
    echo "$m: exit $?"
    # Each figure as it was measured (a run cut short by the timeout still says what it reached).
    grep -v '^\[rollout\]' "$out/engine-$m.err" | tail -3; grep '^\[rollout\]' "$out/engine-$m.err"
    [ -n "${OUT:-}" ] && cp "$out/engine-$m.err" "$OUT/"
    if [ -f "$out/engine-$m-hf/config.json" ] && python3 -c "import transformers" 2> /dev/null; then
      timeout "${ENGINE_HF_TIMEOUT:-150}" python3 scripts/bench/lm_transformers.py "$out/engine-$m-hf" "$out/engine-hf-spec.json" \
        cuda bfloat16 > "$out/engine-$m.hf.json" 2> "$out/engine-$m.hf.err"
      echo "$m transformers: exit $?"
      python3 -c "import json,sys; [print('[transformers]', r['batch'], 'end-to-end %.0f tokens/s' % r['end_to_end_tokens_per_s']) \
        for r in json.load(open(sys.argv[1]))['generation']]" "$out/engine-$m.hf.json" 2>/dev/null
      grep '^{' "$out/engine-$m.hf.err" | sed 's/^/[transformers row] /'
      [ -n "${OUT:-}" ] && cp "$out/engine-$m.hf.json" "$out/engine-$m.hf.err" "$OUT/" 2>/dev/null
    fi
    rm -rf "$out/engine-$m-hf"
  done
fi
if [ "$what" = timing ]; then
  # Issue 17's figures: the launch cost, the timer against events, eager against the candidate.
  scripts/bench_timing.sh $build "$out/timing" 2>&1 | tee "$out/timing.txt"
fi
if [ "$what" = synth ]; then
  # Detached (above): a run longer than one call goes on while the machine stays warm; its log
  # ends with the wall time, and funnel.md comes back once written.
  # SYNTH_RESUME=DIR: a run cut short on a machine since given back goes on from its output
  # folder (the `synth` folder of that call's archive, carried in as DIR): synth reuses the
  # evaluations under DIR's work/bench (docs/synth.md); the two calls' walls add up.
  if [ -n "${SYNTH_RESUME:-}" ] && [ ! -d "$out/synth" ]; then cp -r "$SYNTH_RESUME" "$out/synth"; fi
  kbopt=(); [ -d "${KB_DIR:-kb}/level1" ] && kbopt=(--kernelbench "${KB_DIR:-kb}")
  copy_files="synth-funnel.md $out/synth/funnel.md synth-funnel.json $out/synth/funnel.json"
  detached synth "${SYNTH_TIMEOUT:-1800}" $build/cuda-agent synth --output "$out/synth" --count "${SYNTH_COUNT:-300}" \
    --seed 1 "${kbopt[@]}"
  tr '\r' '\n' < "$out/synth.log" | grep -v '^\[#\|^\[\.' | tail -20; tr '\r' '\n' < "$out/synth.log" | grep '^\[' | tail -1
fi
if [ "$what" = ppo64 ]; then
  # Issue 19's PPO step at 64 episodes: configs/learning.yaml's supervised warm-up (so that the
  # episodes act), then one PPO step of 8 tasks x 8 episodes, all 64 at once through the batch
  # engine. metrics.jsonl splits the step into generation, tools, scoring and the update. Needs the
  # SmolLM2 GGUF in models/ (as learning does).
  copy_files="ppo64-metrics.jsonl $out/ppo64/metrics.jsonl"
  detached ppo64 "${TRAIN_TIMEOUT:-3000}" "$build/cuda-agent" train --config configs/learning.yaml \
    --set run.output_dir="$out/ppo64" --set stages.rft.enabled=false --set stages.value_pretrain.enabled=false \
    --set data.tasks_per_step=8 --set rollout.episodes_per_task=8 --set ppo.batch_size=64 --set ppo.steps=1 \
    --set ppo.mini_batches=4 --set rollout.concurrent_episodes=64 --set rollout.batch_engine=true ${PPO64_SET:-}
  grep -E "^\[train\] (step|baselines)|^ppo64 " "$out/ppo64.log" | tail -8
fi
if [ "$what" = precompile ]; then
  # sandbox.compile_before_lock against without, side by side on one machine: the baselines of
  # data/learning/train's ten tasks, four workers in flight, each run with caches of its own (fresh
  # baselines, and torch.compile's own caches cold in both: TORCHINDUCTOR_CACHE_DIR). Wall times
  # and the phases (scripts/eval_wall.py). PRECOMPILE_TASKS picks another split.
  split=${PRECOMPILE_TASKS:-data/learning/train}
  for on in false true; do
    rm -rf "$out/precompile-$on" "/tmp/precompile-cache-$on" "/tmp/precompile-inductor-$on"
    start=$SECONDS
    CUDA_AGENT_CACHE_DIR=/tmp/precompile-cache-$on TORCHINDUCTOR_CACHE_DIR=/tmp/precompile-inductor-$on \
      timeout "${PRECOMPILE_TIMEOUT:-280}" $build/cuda-agent baselines --split "$split" --workers-per-gpu 4 \
      --output "$out/precompile-$on" --set sandbox.compile_before_lock=$on > "$out/precompile-$on.log" 2>&1
    echo "compile_before_lock=$on: exit $?, wall $((SECONDS - start)) s"
    python3 scripts/eval_wall.py "$out/precompile-$on" 2>&1 | tail -12
  done
fi
if [ "$what" = initlock ]; then
  # sandbox.init_before_lock against without, side by side on one machine: data/core's solved
  # tasks (the first INITLOCK_TASKS, default 24), eager baselines cached first (no torch.compile),
  # then a bench of their reference solutions with four evaluations in flight under the GPU's
  # locks, each setting in its own run; wall, evaluations per minute and the phases
  # (scripts/eval_wall.py: `cuda_init` leaves the exclusive lock's share when on).
  make_core_solved
  head -n $((2 + 3 * ${INITLOCK_TASKS:-24})) $sub/split.yaml > $sub/split.tmp && mv $sub/split.tmp $sub/split.yaml
  nocompile=(--set sandbox.profile_compile=false ${RATE_SET:-})
  timeout "${CORE_BASELINES_TIMEOUT:-300}" $build/cuda-agent baselines --split $sub "${nocompile[@]}" --workers-per-gpu 4 \
    --output "$out/initlock-baselines" > "$out/initlock_baselines.txt" 2>&1
  for on in false true; do
    start=$SECONDS
    timeout "${INITLOCK_TIMEOUT:-240}" $build/cuda-agent bench --split $sub --solutions data/core/solutions \
      "${nocompile[@]}" --workers-per-gpu 4 --set sandbox.init_before_lock=$on --output "$out/initlock-$on" \
      > "$out/initlock_$on.txt" 2> "$out/initlock_$on.err"
    wall=$((SECONDS - start)); n=$(ls "$out/initlock-$on/results" 2>/dev/null | wc -l)
    echo "init_before_lock=$on: $n evaluations in $wall s ($(python3 -c "print(round($n * 60 / max($wall, 1), 1))") a minute)" | tee -a "$out/initlock.txt"
    python3 scripts/eval_wall.py "$out/initlock-$on" 2>&1 | tail -12 | tee -a "$out/initlock.txt"
  done
fi
if [ "$what" = kernelbench ]; then
  kb=${KB_DIR:-kb}
  for level in ${KB_LEVELS:-1 2 3}; do
    split=/tmp/kb-level$level
    mkdir -p $split
    ln -sfn "$root/$kb/level$level" $split/level$level
    start=$SECONDS
    timeout "${KB_TIMEOUT:-3000}" $build/cuda-agent bench --split $split --solutions "$kb/solutions" \
      --output "$out/kb-level$level" --set sandbox.provenance=warn --set sandbox.fallback=off \
      --set sandbox.profile_compile=false ${KB_SET:-} > "$out/kb_level$level.txt" 2> "$out/kb_level$level.err"
    echo "level $level: exit $?, wall $((SECONDS - start)) s" | tee -a "$out/kb_level$level.txt"
    tail -30 "$out/kb_level$level.txt"
  done
fi

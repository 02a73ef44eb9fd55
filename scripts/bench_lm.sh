#!/usr/bin/env bash
# The language-model benchmarks of docs/benchmarks.md (section 6), side by side in one run on a
# GPU machine:
#   scripts/bench_lm.sh BUILD_DIR OUT_DIR
# 1. Prefill and decode tokens/s of a SmolLM2-135M-shaped model (random bf16 weights: speed does
#    not depend on the values) at batch 1, 16 and 64, ca-lm-bench against transformers generate
#    on the same weights (the folder ca-lm-bench writes).
# 2. Peak memory per token of context of a Qwen2.5-1.5B-shaped model: one prefill, and a training
#    forward + backward with per-layer activation checkpointing up to the longest context that fits.
# BENCH_LM_PARTS=generation runs part 1 only.
set -euo pipefail
build=${1:-build}
out=${2:-bench-lm-out}
mkdir -p "$out"
py=$(sed -n 's/^CUDA_AGENT_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
py=${py:-python3}
here=$(cd "$(dirname "$0")" && pwd)

cat > "$out/smollm2.json" <<JSON
{"device": "cuda", "dtype": "bfloat16", "save_hf": "$out/smollm2-hf",
 "config": {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "tie_word_embeddings": true},
 "generation": {"batches": [1, 16, 64], "prompt_tokens": 128, "new_tokens": 128, "repeats": 3}}
JSON
cat > "$out/qwen2_1p5b.json" <<JSON
{"device": "cuda", "dtype": "bfloat16",
 "config": {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
            "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": true, "attention_bias": true},
 "inference_memory": {"contexts": [4096, 16384, 65536]},
 "training": {"contexts": [8192, 32768, 65536, 131072], "checkpoint": true}}
JSON
cat > "$out/qwen2_1p5b_nockpt.json" <<JSON
$(sed -e 's/"checkpoint": true/"checkpoint": false/' -e 's/"contexts": \[8192, 32768, 65536, 131072\]/"contexts": [8192, 16384, 32768, 65536]/' \
      -e '/inference_memory/d' "$out/qwen2_1p5b.json")
JSON

echo "== 1. generation: ca-lm-bench" >&2
"$build/ca-lm-bench" "$out/smollm2.json" > "$out/smollm2.ours.json"
echo "== 1. generation: transformers" >&2
"$py" "$here/bench/lm_transformers.py" "$out/smollm2-hf" "$out/smollm2.json" cuda bfloat16 > "$out/smollm2.hf.json"
rm -rf "$out/smollm2-hf"
if [ "${BENCH_LM_PARTS:-all}" = generation ]; then
  for f in qwen2_1p5b qwen2_1p5b_nockpt; do echo '{"parameters": 0, "dtype": "-", "training": []}' > "$out/$f.ours.json"; done
else
echo "== 2. memory: 1.5B-shaped, checkpointed" >&2
"$build/ca-lm-bench" "$out/qwen2_1p5b.json" > "$out/qwen2_1p5b.ours.json"
echo "== 2. memory: 1.5B-shaped, no checkpointing" >&2
"$build/ca-lm-bench" "$out/qwen2_1p5b_nockpt.json" > "$out/qwen2_1p5b_nockpt.ours.json"
fi

"$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
load = lambda n: json.load(open(f"{out}/{n}"))
ours, hf = load("smollm2.ours.json"), load("smollm2.hf.json")
print(f"SmolLM2-135M-shaped, bf16, prompt {ours['generation'][0]['prompt_tokens']} + "
      f"{ours['generation'][0]['new_tokens']} new tokens, greedy; transformers {hf['transformers']} "
      f"({hf['attn_implementation']}), torch {hf['torch']}\n")
print("| batch | prefill tok/s: ours | transformers | ratio | decode tok/s: ours | transformers | ratio "
      "| decode tok/s: ours without CUDA graphs | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for a, b in zip(ours["generation"], hf["generation"]):
    e = a.get("without_cuda_graphs", {}).get("decode_tokens_per_s", float("nan"))
    print(f"| {a['batch']} | {a['prefill_tokens_per_s']:,.0f} | {b['prefill_tokens_per_s']:,.0f} | "
          f"{a['prefill_tokens_per_s'] / b['prefill_tokens_per_s']:.2f}x | {a['decode_tokens_per_s']:,.0f} | "
          f"{b['decode_tokens_per_s']:,.0f} | {a['decode_tokens_per_s'] / b['decode_tokens_per_s']:.2f}x | "
          f"{e:,.0f} | {e / b['decode_tokens_per_s']:.2f}x |")
mib = lambda v: "-" if v is None else f"{v / 2**20:,.0f}"
for name in ("qwen2_1p5b.ours.json", "qwen2_1p5b_nockpt.ours.json"):
    r = load(name)
    print(f"\n{name}: {r['parameters'] / 1e9:.2f}B parameters, {r['dtype']}")
    rows = r.get("inference_memory", [])
    if rows:
        print("\n| prefill context | peak above weights MiB | per token KiB |\n|---|---|---|")
        for x in rows:
            above = x.get("peak_above_weights_bytes")
            per = "-" if above is None else f"{above / x['context'] / 1024:.1f}"
            print(f"| {x['context']} | {mib(above)} | {per} |")
    print("\n| training context | checkpointing | fits | seconds | peak above weights MiB | per token KiB |\n|---|---|---|---|---|---|")
    for x in r["training"]:
        above = x.get("peak_above_weights_bytes")
        per = "-" if above is None else f"{above / x['context'] / 1024:.1f}"
        secs = f"{x['seconds']:.2f}" if "seconds" in x else "-"
        print(f"| {x['context']} | {x['checkpoint']} | {x['fits']} | {secs} | {mib(above)} | {per} |")
PY

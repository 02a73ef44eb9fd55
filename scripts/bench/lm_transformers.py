"""The transformers side of the language-model benchmark (scripts/bench_lm.sh).

usage: lm_transformers.py MODEL_DIR SPEC.json DEVICE DTYPE

Measures what src/lm/benchmark.cpp measures for the same folder (written by ca-lm-bench's
save_hf), with model.generate: greedy, every row the same prompt length, exactly new_tokens
new tokens (min_new_tokens = max_new_tokens), prefill = generate with one new token, decode =
the rest. Prints JSON rows shaped like ca-lm-bench's "generation".
"""
import json
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def random_tokens(n, vocab, seed):
    # The same generator as src/lm/benchmark.cpp's random_tokens, so both sides see the same prompts.
    mask = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + 1) & mask
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & mask
        out.append((x >> 33) % vocab)
    return out


def main():
    model_dir, spec_path, device, dtype = sys.argv[1:5]
    with open(spec_path) as f:
        spec = json.load(f)["generation"]
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(device).eval()
    vocab = model.config.vocab_size
    prompt_len, new, repeats = spec.get("prompt_tokens", 128), spec.get("new_tokens", 128), spec.get("repeats", 3)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def median_seconds(fn):
        samples = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            samples.append(time.perf_counter() - start)
        return sorted(samples)[len(samples) // 2]

    rows = []
    for batch in spec.get("batches", [1, 16, 64]):
        ids = torch.tensor([random_tokens(prompt_len, vocab, 100 + i) for i in range(batch)], device=device)
        mask = torch.ones_like(ids)

        def generate(n):
            return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                  min_new_tokens=n, pad_token_id=0)

        generate(new)  # warm-up
        t_prefill = median_seconds(lambda: generate(1))
        out = None

        def full():
            nonlocal out
            out = generate(new)

        t_total = median_seconds(full)
        assert out.shape == (batch, prompt_len + new), out.shape
        rows.append({
            "batch": batch, "prompt_tokens": prompt_len, "new_tokens": new,
            "prefill_seconds": t_prefill, "total_seconds": t_total,
            "prefill_tokens_per_s": batch * prompt_len / t_prefill,
            "decode_tokens_per_s": batch * (new - 1) / max(t_total - t_prefill, 1e-9),
            "end_to_end_tokens_per_s": batch * new / t_total,
        })
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each row as measured (a run cut short keeps it)
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
               "attn_implementation": model.config._attn_implementation, "generation": rows}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()

"""Reference logits and greedy tokens from Hugging Face transformers, for the libtorch model's tests.

usage: hf_oracle.py SPEC.json OUT.json

SPEC: {"device": "cpu" | "cuda", "models": [{"dir": folder written by save_hf,
        "tokens": [ids: logits of every position are returned],
        "prompt": [ids], "new_tokens": n: greedy continuation of prompt}]}
OUT:  {"transformers": version, "torch": version,
       "results": [{"logits": [[vocab floats] per token], "greedy": [n ids]}]}

Works with transformers 4.x (torch_dtype=) and 5.x (dtype=). Runs in float32 with TF32 off, so
the comparison is against exact float32 math.
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def dtype_kwargs():
    # transformers 4.56 renamed torch_dtype to dtype; 5.x warns about the old name.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": torch.float32} if (major, minor) >= (4, 56) else {"torch_dtype": torch.float32}


def main():
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    device = torch.device(spec.get("device", "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = []
    for m in spec["models"]:
        model = AutoModelForCausalLM.from_pretrained(m["dir"], attn_implementation="eager", **dtype_kwargs())
        model.to(device).eval()
        with torch.no_grad():
            ids = torch.tensor([m["tokens"]], dtype=torch.long, device=device)
            logits = model(input_ids=ids).logits[0].float().cpu().tolist()
            prompt = torch.tensor([m["prompt"]], dtype=torch.long, device=device)
            n = m["new_tokens"]
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=n,
                pad_token_id=0,
            )
            greedy = out[0, prompt.shape[1]:].cpu().tolist()
        results.append({"logits": logits, "greedy": greedy})
    with open(out_path, "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "results": results}, f)


if __name__ == "__main__":
    main()

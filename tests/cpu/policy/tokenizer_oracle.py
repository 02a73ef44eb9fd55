#!/usr/bin/env python3
"""Oracle for tests/cpu/policy/test_tokenizer.cpp: the Hugging Face `tokenizers` library.

  tokenizer_oracle.py OUT_DIR [--smollm2-gguf PATH]

Writes into OUT_DIR:
  - strings.json: the test strings (deterministic; >= 1000): code, white space, numbers,
    contractions, non-ASCII (NFC and NFD forms, emoji sequences, many scripts), special tokens in
    text, the empty string;
  - one tokenizer.json per configuration, each a byte-level BPE trained here with BpeTrainer on a
    corpus this script makes up (special tokens <|endoftext|>, <|im_start|>, <|im_end|>):
      gpt2         ByteLevel(use_regex) with merges written as "a b" strings
      gpt2_prefix  the same with add_prefix_space
      llama3       Split(Llama 3 regex) + ByteLevel(no regex), ignore_merges
      qwen2        NFC + Split(Qwen2 regex) + ByteLevel(no regex), non-special added tokens
                   <tool_call> / </tool_call> (normalized), merges as [a, b] arrays
      digits       Digits(individual) + ByteLevel(use_regex), trained without the full byte
                   alphabet (so bytes missing from the vocabulary are dropped)
      digit_runs   the same with Digits(individual_digits=False)
    and, when the SmolLM2 GGUF is given (or CUDA_AGENT_SMOLLM2_GGUF names it):
      smollm2_hf   the fast tokenizer transformers converts from the GGUF, as saved
      smollm2      the same with the pre-tokenizer of SmolLM2's published tokenizer.json,
                   Sequence[Digits(individual), ByteLevel], which transformers' GGUF converter
                   does not restore (it writes a bare ByteLevel)
    plus smollm2_gguf_tokenizer.json: the GGUF's tokenizer.* metadata dumped with the gguf package;
  - oracle.json: per configuration its file, the pre-tokenizer's words and the ids of every string
    (parse_special on and off), the decoded text, and decode cases over single ids and random id
    lists.
Prints one line per configuration. Exits 2 when `tokenizers` is missing.
"""

import argparse
import json
import os
import random
import sys

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as e:  # the C++ test turns this into a skip with the message
    print(f"tokenizers is not installed in {sys.executable}: {e} (pip install tokenizers)", file=sys.stderr)
    sys.exit(2)

GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# --- the strings ------------------------------------------------------------------------------

IDENTS = ["x", "y", "idx", "blockIdx", "threadIdx", "sum", "acc", "tile", "warp_reduce", "Model", "forward",
          "get_inputs", "kernel", "stride", "n_elements", "out_ptr", "alpha", "beta", "theta", "señal", "δx"]
COMMENTS = ["TODO: vectorize", "fast path", "don't touch", "see §3.2", "naïve version", "バグ修正", "edge case: n == 0",
            "it's fine", "WE'LL FIX IT", "  trailing  "]

CODE = [
    '#include <cuda_runtime.h>\n#include <vector>\n\n'
    '__global__ void {a}(const float* __restrict__ x, float* y, int n) {{\n'
    '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i] * {n}.0f;  // {c}\n}}\n',
    'template <typename T, int N = {n}>\nstruct {A} {{\n\tT value = T({n2});\n\tstd::array<T, N> items{{}};\n'
    '\tT operator()(T v) const {{ return v * value; }}\n}};\n',
    'for (int {a} = 0; {a} < {n}; ++{a}) {{\r\n    sum += a[{a}] * b[{a}];  // {c}\r\n}}\r\n',
    'def {a}(x, y={n}):\n    """{c}"""\n    if x > y:\n        return x ** 2\n    return [i for i in range(y)]\n',
    'import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n'
    '    def __init__(self):\n        super().__init__()\n\n'
    '    def forward(self, a, b):\n        return torch.matmul(a, b)  # {c}\n\n\ndef get_inputs():\n'
    '    return [torch.randn({n}, {n2}), torch.randn({n2}, {n})]\n',
    'x = {{"{a}": [{n}, {n2}], \'key\': None}}\nprint(f"{{x!r}} -> {{len(x)}}")\n',
    '    const int tid = threadIdx.x;\n    __shared__ float smem[{n}];\n    smem[tid] = (tid < n) ? in[tid] : 0.0f;\n'
    '    __syncthreads();\n    #pragma unroll\n    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{\n'
    '        if (tid < s) smem[tid] += smem[tid + s];\n        __syncthreads();\n    }}\n',
    '{a}<<<grid, block, {n} * sizeof(float), stream>>>(d_in, d_out, {n2});\nCUDA_CHECK(cudaGetLastError());\n',
    '$ nvcc -O3 -arch=sm_90 {a}.cu -o {a} && ./{a} --n={n}\n',
    '<html>\n  <body class="{a}">&nbsp;{c}</body>\n</html>\n',
    '| col | value |\n|-----|------:|\n| {a} | {n} |\n',
    'SELECT {a}, COUNT(*) FROM t WHERE id >= {n} GROUP BY 1;\n',
    '{{"name": "{a}", "arguments": {{"n": {n}, "flag": true, "s": "{c}"}}}}',
    '\tif (x == {n}) {{\n\t\treturn;\n\t}}\n\telse\t{{ y--; }}\n',
    'a = b+c-d*e/f%g**h//i; j += 1; k <<= 2; l != m; n => o; p->q; r::s; t...u\n',
]

WS_UNITS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\r", "\n\n", "\n\n\n", " \n", "\n ", "\u00a0", "\u3000",
            "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\u200b", "\ufeff", "\u202f", "\u1680",
            "\u180e", "\u2003", "\u205f"]

CONTRACTIONS = ["I'M here", "don't", "DON'T", "we'Re", "they'LL", "it'S", "'s", "''s", "'", "can't've", "she'd",
                "I'M'M", "'ſ", "ʼs", "’s", "x'T", " 'll", "\n'm", "'K", "'Ve", "O'Neil's", "rock 'n' roll",
                "'tis", "the '90s", "don’t", "'ﬆ", "'\u212a", "'d'd'd", "''", "' s",
                # a letter after the contraction tells a contraction match from a letter run
                "'ſa", "I'ſm", "he'Sa", "'LLama", "'ﬆa", "'\u212aa", "'Ret", "'VEry", "'Dx", "'mM", "'ſſ"]

NON_ASCII = [
    "café", "naïve", "résumé façade", "cafe\u0301", "e\u0301\u0301", "a\u0328\u0301", "a\u0301\u0328",
    "s\u0323\u0307", "s\u0307\u0323", "\u1e69", "\u212b", "\u2126", "\u00c5", "A\u030a", "한국어 텍스트입니다",
    "\u1112\u1161\u11ab\u1100\u116e\u11a8", "\u1100\u1161", "你好，世界！这是一个测试。", "日本語のテキストとカタカナ ー",
    "👩‍💻 coding", "👍🏽👍🏿", "🇺🇸🇯🇵", "❤️", "👨‍👩‍👧‍👦 family", "مرحبا بالعالم", "שָׁלוֹם", "नमस्ते दुनिया",
    "สวัสดีชาวโลก", "Tiếng Việt có dấu", "Ελληνικά κείμενα", "Привет, мир!", "\u0958\u0959", "\u0915\u093c",
    "ﬁnance", "Ⅻ ⅻ", "∑∫√∞ ≠ ≤", "\u0301start", "x\u20dd", "\u200d", "a\u200db", "Ǆǅǆ", "ß ẞ", "İstanbul",
    "ﬀ ﬃ", "①②③", "½ ¾ ²³", "٣٤٥ ١٢", "१२३४", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "\U0001f600\U0001f601",
    "Ω≈ç√∫˜µ≤≥÷", "\u00e9\u0300", "\u0065\u0301\u0327", "\u0045\u0327\u0301", "\u1e0b\u0323", "q\u0307\u0323",
    "\u0f73", "\u0344", "\u0390", "ᾅ", "\u03b1\u0314\u0301\u0345", "Ǻ", "ǡ", "\uac00\u11a8", "\uac01",
]

RARE = ["\x01\x02\x03", "\x7f", "ქართული ენა", "ሰላም ለዓለም", "ᚠᛇᚻ᛫ᛒᛦᚦ", "ꦧꦱꦗꦮ", "\x00", "𓀀𓀁"]

SPECIAL_TEXT = ["<|im_start|>user\nHello<|im_end|>\n", "<|im_start|><|im_end|>", "<|im_start", "im_end|>",
                "<|endoftext|>x", " <|im_end|> ", "<<|im_end|>>", "a<|im_end|>b", "<|im_end|><|im_end|>",
                "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>",
                "<tool_call>x</tool_call>", "< tool_call>", "<|im_start|>system\nYou are x.<|im_end|>\n<|im_start|>"]


def numbers(rng):
    out = []
    for k in range(1, 41):
        out.append(str(rng.randint(10 ** (k - 1), 10 ** k - 1)))
    out += ["0", "00", "007", "3.14159", "1,000,000", "-42", "+7", "1e-10", "6.02e23", "0x1F", "0b1010", "12:30:45",
            "2024-01-02", "v1.2.3", "1/2", "100%", "$5.99", "  12345  ", "a1b2c3", "x86_64", "sm_90", "fp16",
            " 1", "  22", "\n333", "1 2 3 4 5 6 7 8 9 10"]
    return out


def whitespace(rng):
    out = []
    for _ in range(80):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(WS_UNITS) * rng.randint(1, 3))
            if rng.random() < 0.6:
                parts.append(rng.choice(IDENTS + ["!", "(", "}", "—", "x"]))
        out.append("".join(parts))
    out += [" ", "  ", "\n", "\t", "\r\n", "   \n", "a  ", "a \n", " a", "  a", "a  b", "a\t\tb", "a\n\n b"]
    return out


def code(rng):
    out = []
    for tmpl in CODE:
        for _ in range(4):
            out.append(tmpl.format(a=rng.choice(IDENTS), A=rng.choice(IDENTS).capitalize(), n=rng.randint(0, 4096),
                                   n2=rng.randint(0, 10 ** rng.randint(1, 9)), c=rng.choice(COMMENTS)))
    return out


def make_strings(seed=20240611):
    rng = random.Random(seed)
    pools = [code(rng), whitespace(rng), numbers(rng), CONTRACTIONS, NON_ASCII, RARE, SPECIAL_TEXT]
    fragments = [s for p in pools for s in p]
    strings = [""] + [chr(c) for c in range(32, 127)] + fragments
    seps = ["", " ", "\n", "\t", "  ", "\r\n", ", ", "'"]
    while len(strings) < 1400:
        k = rng.randint(2, 6)
        strings.append("".join(rng.choice(fragments) + rng.choice(seps) for _ in range(k)))
    # A few long ones: long words, long runs, a whole file.
    strings.append(" " * 3000 + "x")
    strings.append("=" * 700)
    strings.append("9" * 500)
    strings.append("a" * 1000)
    strings.append("".join(code(random.Random(7))))
    return strings


def training_corpus(strings):
    rng = random.Random(99)
    corpus = [s for s in strings if not any(r in s for r in RARE)]
    for _ in range(3):
        corpus += code(rng)
    return corpus


# --- the tokenizers ---------------------------------------------------------------------------

def train(corpus, pre, normalizer=None, vocab_size=3000, full_alphabet=True):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    kw = {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()} if full_alphabet else {}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False, **kw)
    tok.train_from_iterator(corpus, trainer)
    return tok


def edit_json(tok, fn):
    j = json.loads(tok.to_str())
    fn(j)
    return Tokenizer.from_str(json.dumps(j)), j


def build_trained(corpus, out_dir):
    made = {}

    def save(name, tok, j=None):
        path = os.path.join(out_dir, f"{name}.tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(j) if j is not None else tok.to_str())
        made[name] = (tok, path)

    gpt2 = train(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False))

    def string_merges(j):
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    tok, j = edit_json(gpt2, string_merges)
    save("gpt2", tok, j)

    def prefix(j):
        j["pre_tokenizer"]["add_prefix_space"] = True
    tok, j = edit_json(gpt2, prefix)
    save("gpt2_prefix", tok, j)

    def split_then_bytes(regex):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama3 = train(corpus, split_then_bytes(LLAMA3_RE))

    def ignore_merges(j):
        j["model"]["ignore_merges"] = True
    tok, j = edit_json(llama3, ignore_merges)
    save("llama3", tok, j)

    qwen2 = train(corpus, split_then_bytes(QWEN2_RE), normalizer=normalizers.NFC())
    qwen2.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("</tool_call>", special=False)])
    save("qwen2", qwen2)

    digits = train(corpus, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False)]),
                   full_alphabet=False)
    save("digits", digits)

    def digit_runs(j):
        j["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = False
    tok, j = edit_json(digits, digit_runs)
    save("digit_runs", tok, j)
    return made


def build_smollm2(gguf_path, out_dir):
    """The real SmolLM2 tokenizer from its GGUF: through transformers, and its metadata as JSON."""
    import gguf  # noqa: F401  (transformers needs it to read GGUF)
    from transformers import AutoTokenizer
    hf_dir = os.path.join(out_dir, "smollm2_hf")
    hf = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    hf.save_pretrained(hf_dir)
    path_hf = os.path.join(hf_dir, "tokenizer.json")
    made = {"smollm2_hf": (Tokenizer.from_file(path_hf), path_hf)}
    with open(path_hf, encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    path = os.path.join(out_dir, "smollm2.tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f)
    made["smollm2"] = (Tokenizer.from_file(path), path)

    reader = gguf.GGUFReader(gguf_path)
    md = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            value = field.contents()
            md[key] = value
    with open(os.path.join(out_dir, "smollm2_gguf_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(md, f, ensure_ascii=True)
    return made


def byte_alphabet_inverse():
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = visible[:], 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, chars)}


def pieces(tok, strings):
    """The pre-tokenizer's words of each string, mapped back from the byte alphabet to text."""
    inverse = byte_alphabet_inverse()
    out = []
    for s in strings:
        words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(s)]
        out.append([bytes(inverse[c] for c in w).decode("utf-8") for w in words])
    return out


def cases(tok, strings, rng):
    ids = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
    tok.encode_special_tokens = True
    plain = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
    tok.encode_special_tokens = False
    decoded = tok.decode_batch(ids, skip_special_tokens=False)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    singles = list(range(vocab)) if vocab <= 4000 else sorted(rng.sample(range(vocab), 4000))
    lists = [[rng.randrange(vocab) for _ in range(rng.randint(1, 8))] for _ in range(500)]
    lists += [i for i in ids if any(x < len(SPECIALS) for x in i)][:100]
    decode_cases = []
    for skip in (False, True):
        batch = [[i] for i in singles] + lists
        for l, text in zip(batch, tok.decode_batch(batch, skip_special_tokens=skip)):
            decode_cases.append({"ids": l, "skip_special": skip, "text": text})
    return {"ids": ids, "ids_plain": plain, "pieces": pieces(tok, strings), "decoded": decoded,
            "decode": decode_cases, "vocab_size": vocab}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--smollm2-gguf", default=os.environ.get("CUDA_AGENT_SMOLLM2_GGUF", ""))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    strings = make_strings()
    with open(os.path.join(args.out_dir, "strings.json"), "w", encoding="utf-8") as f:
        json.dump(strings, f, ensure_ascii=True)
    made = build_trained(training_corpus(strings), args.out_dir)
    smollm2_status = "ok"
    if not args.smollm2_gguf:
        smollm2_status = "skipped: CUDA_AGENT_SMOLLM2_GGUF is not set"
    elif not os.path.isfile(args.smollm2_gguf):
        smollm2_status = f"skipped: {args.smollm2_gguf} does not exist"
    else:
        try:
            made.update(build_smollm2(args.smollm2_gguf, args.out_dir))
        except ImportError as e:
            smollm2_status = f"skipped: {e} (pip install transformers gguf)"
    rng = random.Random(5)
    out = {"strings": len(strings), "smollm2": smollm2_status, "tokenizers": {}}
    for name, (tok, path) in made.items():
        c = cases(tok, strings, rng)
        c["path"] = path
        out["tokenizers"][name] = c
        print(f"{name}: {path}, vocab {c['vocab_size']}, {len(strings)} strings, {len(c['decode'])} decode cases")
    print(f"smollm2: {smollm2_status}")
    with open(os.path.join(args.out_dir, "oracle.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True)


if __name__ == "__main__":
    main()

// The Python side of `cuda-agent synth` (synth.h): the catalogue crawl, the typed sampler, the AST
// similarity and the check of an LLM's reply, run in a child process as
//   python3 -c kSynthScript MODE IN_JSON OUT_JSON
// (each mode reads its arguments from IN_JSON and writes its answer to OUT_JSON).
namespace cuda_agent::bench {
extern const char* const kSynthScript;
const char* const kSynthScript = R"PY(
import ast, hashlib, inspect, json, math, random, re, sys, warnings

warnings.filterwarnings("ignore")


def _torch():
    import torch
    torch.set_num_threads(1)
    return torch


# ---------------------------------------------------------------- the catalogue, by probing
PROBE = {2: (6, 10), 3: (3, 6, 10), 4: (2, 6, 10, 12)}
# Names that are not compute on an input tensor: creation, randomness, I/O, state, views and
# copies (cheap and degenerate as a task's op), and in-place forms.
DENY = re.compile(
    r"^(rand|randn|randint|randperm|normal|bernoulli|binomial|multinomial|poisson|dropout|alpha_dropout|feature_alpha_dropout|"
    r"empty|zeros|ones|full|arange|range|linspace|logspace|eye|tensor|as_tensor|asarray|from_|frombuffer|load|save|"
    r"manual_seed|seed|initial_seed|set_|get_|is_|use_|can_cast|promote_types|result_type|compile|jit|vmap|cond|"
    r"sym_|quantize|quantized|fake_|fbgemm|mkldnn|miopen|cudnn|native_|clone|detach|contiguous|view|alias|squeeze|"
    r"unsqueeze|flatten|ravel|reshape|t$|transpose|permute|movedim|moveaxis|swap|narrow|select|index|gather|scatter|"
    r"take|masked|where|nonzero|argwhere|unique|sort|argsort|topk|kthvalue|msort|flip|roll|rot90|chunk|split|tensor_split|"
    r"hsplit|vsplit|dsplit|unbind|stack|cat|concat|hstack|vstack|dstack|column_stack|broadcast|expand|tile|repeat|"
    r"diag|tril|triu|block_diag|cartesian|combinations|meshgrid|atleast|numel|resolve|conj|real|imag|view_as|"
    r"dequantize|embedding|bilinear|ctc|nll|cross_entropy|binary_cross|kl_div|.*_loss$|pad|interpolate|upsample|"
    r"grid_sample|affine_grid|pixel|channel_shuffle|one_hot|fold|unfold|histc|histogram|bincount|bucketize|"
    r"searchsorted|cdist|pdist|cosine_similarity|pairwise|batch_norm|instance_norm|group_norm|layer_norm|rms_norm|"
    r"local_response_norm|max_pool|avg_pool|adaptive|lp_pool|fractional|conv|linear|scaled_dot|multi_head|"
    r"gumbel|rrelu|slice_|chain_matmul|positive$|.*_$)")


def _ok_tensor(torch, y):
    return (isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() >= 1 and y.numel() > 0
            and bool(torch.isfinite(y).all()))


def _probe_call(torch, fn, template, rank, arity):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(PROBE[rank], generator=g) for _ in range(arity)]
    env = {"f": fn, "x": xs[0], "y": xs[-1]}
    a = eval(template.replace("{x}", "x").replace("{y}", "y"), env)
    b = eval(template.replace("{x}", "x").replace("{y}", "y"), env)
    if not _ok_tensor(torch, a) or not torch.equal(a, b):
        return None
    return list(a.shape)


def _function_entry(torch, qual, fn, call_name):
    tries = [(1, call_name + "({x})"), (1, call_name + "({x}, dim=-1)"), (2, call_name + "({x}, {y})")]
    for arity, template in tries:
        ranks, same = [], True
        for r in PROBE:
            try:
                shape = _probe_call(torch, fn, template.replace(call_name, "f"), r, arity)
            except Exception:
                shape = None
            if shape is not None:
                ranks.append(r)
                same = same and shape == list(PROBE[r])
        if ranks and same:
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                sig = ""
            return {"name": qual, "kind": "function", "call": template, "arity": arity, "ranks": ranks,
                    "dtypes": ["float32"], "shape": "same", "signature": sig,
                    "constraints": "two inputs of one shape" if arity == 2 else "one input"}
    return None


# Constructor arguments by parameter name: what a module's size arguments are tied to.
CTOR_RULES = {"in_features": "last", "out_features": "new_last", "normalized_shape": "last", "num_features": "dim1",
              "num_channels": "dim1", "in_channels": "dim1", "out_channels": "new_dim1", "kernel_size": 3,
              "num_groups": 2, "padding": 1, "hidden_size": "last", "dim": "last"}


def _module_entry(torch, qual, cls):
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    ctor = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in CTOR_RULES and (p.default is inspect.Parameter.empty or p.name == "padding"):
            ctor.append([p.name, CTOR_RULES[p.name]])
        elif p.default is inspect.Parameter.empty:
            return None
    ranks, shapes = [], {}
    for r, shape in PROBE.items():
        try:
            m = cls(**{k: _ctor_value(v, shape) for k, v in ctor}).eval()
            g = torch.Generator().manual_seed(0)
            x = torch.randn(shape, generator=g)
            with torch.no_grad():
                a, b = m(x), m(x)
            if not _ok_tensor(torch, a) or not torch.equal(a, b) or a.dim() != len(shape):
                continue
            ranks.append(r)
            shapes[r] = list(a.shape)
        except Exception:
            continue
    if not ranks:
        return None
    changes = any(rule in ("new_last", "new_dim1") for _, rule in ctor)
    if not changes and any(shapes[r] != list(PROBE[r]) for r in ranks):
        return None  # a shape the sampler cannot follow (GLU halves a dim)
    ties = {"last": "the input's last dim", "dim1": "the input's dim 1", "new_last": "a new last dim (output)",
            "new_dim1": "a new dim 1 (output)"}
    constraints = "; ".join(f"{name} = {ties[rule]}" if rule in ties else f"{name} = {rule}" for name, rule in ctor)
    return {"name": qual, "kind": "module", "ctor": ctor, "arity": 1, "ranks": ranks, "dtypes": ["float32"],
            "constraints": constraints or "one input",
            "shape": "same" if all(shapes[r] == list(PROBE[r]) for r in ranks) else "changed",
            "signature": str(inspect.signature(cls.__init__))}


def _ctor_value(rule, shape):
    """A constructor argument for probing at `shape` (a new size: twice the one it replaces)."""
    if isinstance(rule, int):
        return rule
    return {"last": shape[-1], "dim1": shape[1], "new_last": shape[-1] * 2, "new_dim1": shape[1] * 2}[rule]


def catalogue(args):
    torch = _torch()
    import torch.nn as nn
    import torch.nn.functional as F
    entries = []
    for name in sorted(dir(F)):
        fn = getattr(F, name)
        if name.startswith("_") or DENY.match(name) or not callable(fn) or inspect.isclass(fn):
            continue
        e = _function_entry(torch, "torch.nn.functional." + name, fn, "F." + name)
        if e:
            entries.append(e)
    seen = {e["name"].rsplit(".", 1)[1] for e in entries}
    for name in sorted(dir(torch)):
        fn = getattr(torch, name, None)
        if (name.startswith("_") or DENY.match(name) or name in seen or not callable(fn) or inspect.isclass(fn)
                or inspect.ismodule(fn)):
            continue
        e = _function_entry(torch, "torch." + name, fn, "torch." + name)
        if e:
            entries.append(e)
    for name in sorted(dir(nn)):
        cls = getattr(nn, name)
        if not (inspect.isclass(cls) and issubclass(cls, nn.Module)) or name.startswith("_"):
            continue
        if re.match(r"^(Module|Sequential|ModuleList|ModuleDict|Parameter|Container|Identity|Dropout|AlphaDropout|"
                    r"FeatureAlphaDropout|RReLU|Lazy|Embedding|Transformer|Multihead|RNN|LSTM|GRU|.*Loss$|Upsample|"
                    r"Flatten|Unflatten|Fold|Unfold|ChannelShuffle|PixelShuffle|PixelUnshuffle|.*Pad.*|"
                    r"Bilinear|Softmax2d|.*Pool.*|CircularPad|ConvTranspose|SyncBatchNorm)", name):
            continue
        e = _module_entry(torch, "torch.nn." + name, cls)
        if e:
            entries.append(e)
    try:
        from transformers.activations import ACT2CLS
        classes = {}
        for cls in ACT2CLS.values():
            cls = cls[0] if isinstance(cls, tuple) else cls
            if cls.__module__.startswith("transformers."):  # not torch's own, re-exported
                classes[cls.__name__] = cls
        for _, cls in sorted(classes.items()):
            e = _module_entry(torch, f"transformers.activations.{cls.__name__}", cls)
            if e:
                e["import"] = "transformers.activations"
                entries.append(e)
    except Exception:
        pass
    # transformers' normalisation layers (RMS norms of the common model families).
    import importlib
    for modname, clsname in (("transformers.models.llama.modeling_llama", "LlamaRMSNorm"),
                             ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"),
                             ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"),
                             ("transformers.models.t5.modeling_t5", "T5LayerNorm")):
        try:
            cls = getattr(importlib.import_module(modname), clsname)
        except Exception:
            continue
        e = _module_entry(torch, f"{modname}.{clsname}", cls)
        if e:
            e["import"] = modname
            entries.append(e)
    return {"torch": torch.__version__, "entries": entries}


# ---------------------------------------------------------------- the typed sampler
OP_COUNT_WEIGHTS = [(1, 0.05), (2, 0.6), (3, 0.2), (4, 0.1), (5, 0.05)]


def _pick_count(rng, max_ops):
    items = [(n, w) for n, w in OP_COUNT_WEIGHTS if n <= max_ops]
    total = sum(w for _, w in items)
    u = rng.random() * total
    for n, w in items:
        u -= w
        if u <= 0:
            return n
    return items[-1][0]


def _pick_dims(rng, rank):
    target = 2 ** rng.randint(24, 27)
    if rank == 2:
        d = rng.choice([256, 512, 1024, 2048, 4096])
        return [max(16, target // d), d]
    if rank == 3:
        d = rng.choice([128, 256, 512, 1024])
        b = rng.choice([8, 16, 32, 64])
        return [b, max(16, target // (b * d)), d]
    c = rng.choice([16, 32, 64, 128])
    hw = rng.choice([32, 64, 128, 256])
    return [max(1, target // (c * hw * hw)), c, hw, hw]


class Composition:
    def __init__(self, rank, dims):
        self.rank, self.dims = rank, dims
        self.dim_names = [f"d{i}" for i in range(len(dims))]
        self.inputs = ["x0"]
        self.values = [("x0", rank, ["d%d" % i for i in range(rank)])]  # name, rank, symbolic shape
        self.lines, self.modules, self.ops, self.imports = [], [], [], set()

    def new_dim(self, value):
        self.dim_names.append(f"d{len(self.dims)}")
        self.dims.append(value)
        return self.dim_names[-1]


HEAVY_SHARE = 0.7  # compositions that start with a matrix product or a convolution


def _heavy(e):
    return e["kind"] == "module" and any(rule in ("new_last", "new_dim1") for _, rule in e["ctor"])


def _compose(rng, cat, max_ops):
    n = _pick_count(rng, max_ops)
    heavy = [e for e in cat if _heavy(e)]
    first = rng.choice(heavy if heavy and rng.random() < HEAVY_SHARE else cat)
    rank = rng.choice(first["ranks"])
    comp = Composition(rank, _pick_dims(rng, rank))
    cur = ("x0", rank, list(comp.values[0][2]))
    for step in range(n):
        e = first if step == 0 else rng.choice([c for c in cat if cur[1] in c["ranks"]] or [first])
        if cur[1] not in e["ranks"]:
            return None
        out = f"h{step}"
        shape = list(cur[2])
        if e["kind"] == "function":
            other = None
            if e["arity"] == 2:
                same = [v for v in comp.values if v[2] == cur[2] and v[0] != cur[0]]
                if same and rng.random() < 0.5:
                    other = rng.choice(same)[0]
                else:
                    other = f"x{len(comp.inputs)}"
                    comp.inputs.append(other)
                    comp.values.append((other, cur[1], list(cur[2])))
            expr = e["call"].replace("{x}", cur[0]).replace("{y}", other or cur[0])
        else:
            args = []
            for pname, rule in e["ctor"]:
                if rule == "last":
                    args.append(f"{pname}={shape[-1]}")
                elif rule == "dim1":
                    args.append(f"{pname}={shape[1]}")
                elif rule == "new_last":
                    nd = comp.new_dim(rng.choice([512, 1024, 2048, 4096]))
                    args.append(f"{pname}={nd}")
                    shape[-1] = nd
                elif rule == "new_dim1":
                    nd = comp.new_dim(rng.choice([16, 32, 64, 128]))
                    args.append(f"{pname}={nd}")
                    shape[1] = nd
                else:
                    args.append(f"{pname}={rule}")
            ctor = e["name"].replace("torch.nn.", "nn.")
            if e.get("import"):
                comp.imports.add(e["import"])
            comp.modules.append((f"op{step}", f"{ctor}({', '.join(args)})"))
            expr = f"self.op{step}({cur[0]})"
        comp.lines.append(f"{out} = {expr}")
        comp.ops.append(e["name"])
        cur = (out, cur[1], shape)
        comp.values.append(cur)
    comp.result = cur[0]
    return comp


def _render(comp, seed):
    dims_used = comp.dim_names
    ops = " -> ".join(comp.ops)
    out = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    out += [f"import {m}" for m in sorted(comp.imports)]
    out += ["", "", "class Model(nn.Module):", f'    """Synthesized by cuda-agent synth (seed {seed}): {ops}."""', "",
            f"    def __init__(self, {', '.join(dims_used)}):", "        super().__init__()"]
    out += [f"        self.{name} = {ctor}" for name, ctor in comp.modules]
    out += ["", f"    def forward(self, {', '.join(comp.inputs)}):"]
    out += [f"        {line}" for line in comp.lines]
    out += [f"        return {comp.result}", "", ""]
    out += [f"{name} = {value}" for name, value in zip(comp.dim_names, comp.dims)]
    shape = ", ".join(comp.dim_names[:comp.rank])
    out += ["", "", "def get_inputs():", f"    return [{', '.join(f'torch.randn({shape})' for _ in comp.inputs)}]", "",
            "", "def get_init_inputs():", f"    return [{', '.join(dims_used)}]", ""]
    return "\n".join(out)


def _module_ns(code, dims):
    """The task module's namespace with its size variables d0, d1, ... set to `dims`."""
    ns = {}
    exec(compile(code, "<synth>", "exec"), ns)
    for i, d in enumerate(dims):
        ns[f"d{i}"] = d
    return ns


def _smoke(torch, code, dims, small):
    """Runs the module at small sizes on the CPU (every size variable set to at most `small`).
    Returns None or why it failed."""
    ns = _module_ns(code, [min(d, small) if i < 4 else min(d, small * 2) for i, d in enumerate(dims)])
    torch.manual_seed(0)
    m = ns["Model"](*ns["get_init_inputs"]()).eval()
    with torch.no_grad():
        y = m(*ns["get_inputs"]())
    if not isinstance(y, torch.Tensor) or not bool(torch.isfinite(y).all()):
        return "non-finite or non-tensor output at small sizes"
    return None


# A roofline of the H200 in float32 without TF32, for choosing sizes only (the filter measures).
EST_FLOPS = 40e12
EST_BYTES_PER_S = 3.0e12
MAX_TENSOR_ELEMENTS = 1 << 27  # 512 MiB of float32: the inputs are drawn on the CPU, per round


def _meta_run(torch, code, dims):
    """One forward at full size on the meta device (shapes only): eager's time on the roofline
    (FLOPs of matrix products and convolutions, plus every value the forward makes written and
    read once), the largest tensor's elements and the output's."""
    from torch.utils.flop_counter import FlopCounterMode
    ns = _module_ns(code, dims)
    with torch.device("meta"):
        m = ns["Model"](*ns["get_init_inputs"]())
        inputs = ns["get_inputs"]()
        seen = []

        class Sizes(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if isinstance(out, torch.Tensor):
                    seen.append(out.numel())
                return out

        with FlopCounterMode(display=False) as fc, Sizes():
            y = m(*inputs)
    moved = 4 * (sum(t.numel() for t in inputs) + 2 * sum(seen) + y.numel())
    biggest = max([t.numel() for t in inputs] + seen + [y.numel()])
    return fc.get_total_flops() / EST_FLOPS * 1e3 + moved / EST_BYTES_PER_S * 1e3, biggest, y.numel()


def _fit_batch(torch, comp, seed, log_target_ms):
    """Scales the batch size d0 (every op here is linear in it) so that eager's estimated time is
    exp(log_target_ms), no tensor over MAX_TENSOR_ELEMENTS. Returns the estimate and the output's
    elements at the new size."""
    est, biggest, _ = _meta_run(torch, _render(comp, seed), comp.dims)
    factor = math.exp(log_target_ms) / max(est, 1e-6)
    factor = min(factor, MAX_TENSOR_ELEMENTS / max(biggest, 1))
    comp.dims[0] = max(1, int(comp.dims[0] * factor))
    est, _, out_elements = _meta_run(torch, _render(comp, seed), comp.dims)
    return est, out_elements


def sample(args):
    """args["max_similarity"] (default 1: off): a composition whose AST similarity to an earlier
    candidate of this call is above it (the same ops at other sizes) is drawn again, as one that
    fails at small sizes is, so that the GPU's evaluations go to tasks the similarity filter will
    keep."""
    torch = _torch()
    cat = [e for e in json.load(open(args["catalogue"]))["entries"] if not e.get("disabled")]
    out, rejected, seen = [], {}, []
    max_similarity = args.get("max_similarity", 1.0)
    for i in range(args["count"]):
        seed = args["seed"] * 1000003 + i
        rng = random.Random(seed)
        for attempt in range(args.get("attempts", 20)):
            comp = _compose(rng, cat, args["max_ops"])
            if comp is None:
                rejected["composition"] = rejected.get("composition", 0) + 1
                continue
            try:
                estimate, out_elements = _fit_batch(torch, comp, seed, rng.uniform(math.log(2.0), math.log(20.0)))
                code = _render(comp, seed)
                why = ("empty output" if out_elements == 0 else
                       f"output of {out_elements * 4 / 2**30:.1f} GiB" if out_elements * 4 > 4 << 30 else
                       _smoke(torch, code, comp.dims, 8))
            except Exception as e:
                why = f"{type(e).__name__}: {str(e)[:200]}"
            if why is None and max_similarity < 1.0:
                feats = _features(code)
                if any(dice(feats, g) > max_similarity for g in seen):
                    why = "a repeat of an earlier candidate (AST similarity above max_similarity)"
                else:
                    seen.append(feats)
            if why is None:
                out.append({"index": i, "seed": seed, "attempts": attempt + 1, "ops": comp.ops, "code": code,
                            "estimated_eager_ms": round(estimate, 3)})
                break
            key = why.split(":")[0]
            rejected[key] = rejected.get(key, 0) + 1
    return {"candidates": out, "rejected": rejected}


# ---------------------------------------------------------------- AST similarity
KEEP_NAMES = {"torch", "nn", "F", "self", "math", "super"}


def _features(code):
    """The multiset of normalised subtree hashes of the model's methods (forward, __init__ and the
    rest of class Model, or of every class when none is named Model): variable, argument and
    attribute-of-self names, and numbers, are placeholders, so renaming and resizing change
    nothing; the ops called (torch.relu, nn.Conv2d) stay."""
    tree = ast.parse(code)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    roots = [c for c in classes if c.name == "Model"] or classes
    feats = {}

    def h(node):
        if isinstance(node, ast.Name):
            label = "N:" + (node.id if node.id in KEEP_NAMES else "_")
        elif isinstance(node, ast.arg):
            label = "A"
        elif isinstance(node, ast.Attribute):
            base = node.value
            label = "T:" + ("_" if isinstance(base, ast.Name) and base.id == "self" else node.attr)
        elif isinstance(node, ast.Constant):
            label = "C:" + ("n" if isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
                            else repr(node.value))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            label = type(node).__name__
        elif isinstance(node, ast.keyword):
            label = "K:" + str(node.arg)
        elif isinstance(node, (ast.Load, ast.Store, ast.Del)):
            return None
        else:
            label = type(node).__name__
            for f in ("op",):
                if hasattr(node, f):
                    label += ":" + type(getattr(node, f)).__name__
        kids = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Expr) and isinstance(getattr(child, "value", None), ast.Constant) \
                    and isinstance(child.value.value, str):
                continue  # docstrings
            k = h(child)
            if k is not None:
                kids.append(k)
        digest = hashlib.sha1((label + "(" + ",".join(kids) + ")").encode()).hexdigest()[:16]
        feats[digest] = feats.get(digest, 0) + 1
        return digest

    for c in roots:
        for item in c.body:
            if isinstance(item, ast.FunctionDef):
                for stmt in item.body:
                    if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "__init__"):
                        continue  # super().__init__()
                    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        continue
                    h(stmt)
    return feats


def dice(a, b):
    if not a and not b:
        return 1.0
    common = sum(min(v, b.get(k, 0)) for k, v in a.items())
    return 2.0 * common / (sum(a.values()) + sum(b.values()))


def similarity(args):
    def feats_of(path):
        try:
            return _features(open(path, encoding="utf-8").read())
        except Exception:
            return None
    refs = [(p, feats_of(p)) for p in args["references"]]
    refs = [(p, f) for p, f in refs if f is not None]
    threshold = args["threshold"]
    accepted, out = [], []
    for c in args["candidates"]:
        f = feats_of(c["path"])
        r = {"id": c["id"], "reference_max": None, "reference_nearest": None, "accepted_max": None,
             "accepted_nearest": None, "accepted": False}
        if f is None:
            r["error"] = "does not parse"
            out.append(r)
            continue
        for p, g in refs:
            s = dice(f, g)
            if r["reference_max"] is None or s > r["reference_max"]:
                r["reference_max"], r["reference_nearest"] = s, p
        for i, g in accepted:
            s = dice(f, g)
            if r["accepted_max"] is None or s > r["accepted_max"]:
                r["accepted_max"], r["accepted_nearest"] = s, i
        if c.get("eligible", True) and (r["reference_max"] or 0) <= threshold and (r["accepted_max"] or 0) <= threshold:
            r["accepted"] = True
            accepted.append((c["id"], f))
        out.append(r)
    return {"results": out}


# ---------------------------------------------------------------- an LLM's reply
def check_replies(args):
    out = []
    for text in args["replies"]:
        blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.S)
        code = max(blocks, key=len) if blocks else text
        r = {"ok": False, "code": None, "reason": None}
        if not code.strip() or (not blocks and "class Model" not in text):
            r["reason"] = "no code in the reply"
        else:
            try:
                tree = ast.parse(code)
                names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
                missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
                if missing:
                    r["reason"] = "the code defines no " + ", ".join(missing)
                else:
                    r["ok"], r["code"] = True, code.strip() + "\n"
            except SyntaxError as e:
                r["reason"] = f"the code does not parse: line {e.lineno}: {e.msg}"
        out.append(r)
    return {"results": out}


MODES = {"catalogue": catalogue, "sample": sample, "similarity": similarity, "check": check_replies}

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in MODES:
        with open(sys.argv[2], encoding="utf-8") as f:
            a = json.load(f)
        result = MODES[sys.argv[1]](a)
        with open(sys.argv[3], "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
)PY";
}  // namespace cuda_agent::bench

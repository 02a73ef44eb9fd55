#!/usr/bin/env python3
"""CPU-only checks of the red-team suite (no GPU, no torch needed):

- manifest.json is well formed: unique gtest-safe names, kind hack|legit, existing task and
  solution files, a known category per hack and "pass" per legit entry, a neutralized hack's
  honest twin a legit entry of its task, and every folder under hacks/ and legit/ is used by at
  least one entry;
- every model.py / model_new.py parses, and every hack's and legit solution's header comment
  states what it is (a hack's "expect" matches its manifest entry);
- every cuda_agent.compile(...) source compiles with NVRTC through `cuda-agent compile`, with the
  same name expressions and options the solution passes.

Usage: check_sources.py [--cuda-agent PATH] [--arch sm_90]. Exit status 0 when everything holds.
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
CATEGORIES = {
    "compile_error", "load_error", "interface_error", "runtime_error", "illegal_memory_access", "out_of_memory",
    "timeout", "crash", "mismatch", "forbidden_fallback", "precision", "input_modified", "invalid_output",
    "nondeterministic", "timing_mismatch", "tampering",
}
OPTION_KEYS = {"precision", "fallback", "provenance", "integrity_checks", "secret_seeds", "trials", "atol", "rtol",
               "timed_runs", "timeout_s", "forward_timeout_s", "gpu_wait_s", "read_scope", "profile_compile", "compile_baseline"}
OPTION_VALUES = {"precision": {"loose", "strict", "tf32"}, "fallback": {"off", "warn", "enforce"},
                 "provenance": {"off", "warn", "enforce"}, "read_scope": {"all", "system"},
                 "profile_compile": {True, False}, "compile_baseline": {"cached", "fresh"}}
SIMPLE_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.JoinedStr, ast.FormattedValue, ast.List,
                ast.Tuple, ast.BinOp, ast.Add, ast.Mult)


def check_manifest(errors):
    path = os.path.join(HERE, "manifest.json")
    with open(path) as f:
        entries = json.load(f)
    seen, used = set(), set()
    for i, e in enumerate(entries):
        where = f"manifest entry {i} ({e.get('name', '?')})"
        name = e.get("name", "")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            errors.append(f"{where}: name must be letters, digits and '_' (a gtest parameter name)")
        if name in seen:
            errors.append(f"{where}: duplicate name")
        seen.add(name)
        if e.get("kind") not in ("hack", "legit"):
            errors.append(f"{where}: kind must be 'hack' or 'legit'")
        for key in ("task", "solution"):
            if not os.path.isfile(os.path.join(ROOT, e.get(key, ""))):
                errors.append(f"{where}: {key} {e.get(key)!r} does not exist")
        expect = e.get("expect")
        if e.get("kind") == "legit" and expect != "pass":
            errors.append(f"{where}: a legit entry must expect 'pass'")
        if e.get("kind") == "hack" and expect not in CATEGORIES | {"neutralized", "degenerate"}:
            errors.append(f"{where}: unknown category {expect!r}")
        if expect == "neutralized" and not (isinstance(e.get("max_speedup"), (int, float)) and e["max_speedup"] > 0):
            errors.append(f"{where}: a neutralized hack needs a positive max_speedup")
        bound = e.get("max_speedup_vs_compile")
        if bound is not None and not (expect == "neutralized" and isinstance(bound, (int, float)) and bound > 0):
            errors.append(f"{where}: max_speedup_vs_compile is a positive bound of a neutralized hack")
        wall = e.get("max_wall_s")
        if wall is not None and not (isinstance(wall, (int, float)) and wall > 0):
            errors.append(f"{where}: max_wall_s is a positive number of seconds")
        for other in e.get("also", []):
            if e.get("kind") != "hack" or other not in CATEGORIES:
                errors.append(f"{where}: 'also' lists {other!r}: only hacks may, and only known categories")
        if not e.get("defence"):
            errors.append(f"{where}: say which defence catches it ('defence')")
        unknown = set(e.get("options", {})) - OPTION_KEYS
        if unknown:
            errors.append(f"{where}: unknown option keys {sorted(unknown)}")
        if not isinstance(e.get("gpu_lock", False), bool):
            errors.append(f"{where}: gpu_lock must be true or false")
        for key, allowed in OPTION_VALUES.items():
            value = e.get("options", {}).get(key)
            if value is not None and value not in allowed:
                errors.append(f"{where}: option {key} is {value!r}, not one of {sorted(allowed)}")
        used.add(os.path.normpath(os.path.dirname(os.path.join(ROOT, e.get("solution", "")))))
    by_name = {e.get("name"): e for e in entries}
    for i, e in enumerate(entries):
        if "twin" not in e and "max_gain_over_twin" not in e:
            continue
        where = f"manifest entry {i} ({e.get('name', '?')})"
        twin = by_name.get(e.get("twin"))
        gain = e.get("max_gain_over_twin")
        if e.get("expect") != "neutralized" or not (isinstance(gain, (int, float)) and gain >= 1):
            errors.append(f"{where}: twin belongs to a neutralized hack, with max_gain_over_twin of at least 1")
        if twin is None or twin.get("kind") != "legit" or twin.get("task") != e.get("task"):
            errors.append(f"{where}: twin {e.get('twin')!r} must name a legit entry of the same task")
    for kind in ("hacks", "legit"):
        for folder in sorted(os.listdir(os.path.join(HERE, kind))):
            if os.path.normpath(os.path.join(HERE, kind, folder)) not in used:
                errors.append(f"{kind}/{folder} is in no manifest entry")
    return entries


def module_constants(tree):
    """Module-level names bound to simple constant expressions (strings, ints, f-strings of those)."""
    env = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            expr = ast.Expression(node.value)
            if all(isinstance(n, SIMPLE_NODES) for n in ast.walk(expr)):
                try:
                    env[node.targets[0].id] = eval(compile(expr, "<const>", "eval"), {"__builtins__": {}}, dict(env))
                except Exception:
                    pass
    return env


def evaluate(node, env):
    expr = ast.Expression(node)
    if not all(isinstance(n, SIMPLE_NODES) for n in ast.walk(expr)):
        raise ValueError(f"not a constant expression: {ast.unparse(node)}")
    return eval(compile(expr, "<arg>", "eval"), {"__builtins__": {}}, dict(env))


def compile_calls(tree):
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "cuda_agent"):
            yield node


def check_solution(path, entry_kinds, cuda_agent, arch, errors):
    rel = os.path.relpath(path, ROOT)
    with open(path) as f:
        text = f.read()
    try:
        tree = ast.parse(text, path)
    except SyntaxError as e:
        errors.append(f"{rel}: does not parse: {e}")
        return 0
    first = text.splitlines()[0] if text else ""
    if "/hacks/" in path:
        m = re.match(r"# HACK \(expect (\w+)", first)
        if not m:
            errors.append(f"{rel}: the first line must be '# HACK (expect <category>...): what it does'")
        for expect in entry_kinds.get(os.path.normpath(path), []):
            if m and m.group(1) != expect:
                errors.append(f"{rel}: header says {m.group(1)}, a hack entry expects {expect}")
    elif "/legit/" in path and not first.startswith("# LEGIT"):
        errors.append(f"{rel}: the first line must be '# LEGIT (must pass...): what it does'")
    env = module_constants(tree)
    compiled = 0
    for call in compile_calls(tree):
        try:
            source = evaluate(call.args[0], env)
            kwargs = {k.arg: evaluate(k.value, env) for k in call.keywords}
        except (ValueError, NameError, IndexError) as e:
            errors.append(f"{rel}:{call.lineno}: cannot resolve the compile() arguments: {e}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cu = os.path.join(tmp, "model_new.cu")
            with open(cu, "w") as f:
                f.write(source)
            cmd = [cuda_agent, "compile", cu, "--arch", arch]
            for name in kwargs.get("name_expressions") or []:
                cmd += ["--name-expression", name]
            for option in kwargs.get("options") or []:
                cmd += ["--option", option]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                errors.append(f"{rel}:{call.lineno}: NVRTC rejected the source:\n{run.stdout}{run.stderr}")
            else:
                compiled += 1
    return compiled


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-agent", default=os.environ.get("CUDA_AGENT_BIN", os.path.join(ROOT, "build", "cuda-agent")))
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    errors = []
    entries = check_manifest(errors)
    entry_kinds = {}
    for e in entries:
        if e.get("kind") == "hack":
            entry_kinds.setdefault(os.path.normpath(os.path.join(ROOT, e.get("solution", ""))), []).append(e.get("expect"))
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(HERE) for f in fs if f in ("model.py", "model_new.py"))
    compiled = 0
    for path in files:
        if path.endswith("model.py"):
            try:
                with open(path) as f:
                    ast.parse(f.read(), path)
            except SyntaxError as e:
                errors.append(f"{os.path.relpath(path, ROOT)}: does not parse: {e}")
        else:
            compiled += check_solution(path, entry_kinds, args.cuda_agent, args.arch, errors)
    for e in errors:
        print("FAIL:", e)
    hacks = sum(e.get("kind") == "hack" for e in entries)
    print(f"{len(entries)} manifest entries ({hacks} hacks, {len(entries) - hacks} legit), {len(files)} Python files, "
          f"{compiled} NVRTC sources compiled, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

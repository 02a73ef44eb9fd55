# A kernel exported by `cuda-agent export`: `Model` replaces the task's Model in user code (same
# constructor, same parameters and state_dict keys). Each call runs the exported kernels when the
# call looks like what the sandbox verified (input shapes and dtypes, CUDA device of the verified
# architecture, contiguous and aligned tensors, the verified torch version), else the fallback:
# the reference under torch.compile (or eager, as exported). stats() counts both and the reasons.
#
# At import every file is checked against manifest.json: a changed kernel or solution switches
# the package to its fallback; a changed reference (the fallback itself) fails the import.
# state.json holds the mode ("kernel", or "fallback" after a canary's rollback);
# CUDA_AGENT_EXPORT_FALLBACK=1 forces the fallback too.
import hashlib
import importlib.util
import json
import os
import sys
import threading
import warnings

import torch

from . import _guard, _runtime

_HERE = os.path.dirname(os.path.abspath(__file__))


def _read_json(name):
    with open(os.path.join(_HERE, name)) as f:
        return json.load(f)


MANIFEST = _read_json("manifest.json")
AUDIT = _read_json("audit.json")
VERIFIED = MANIFEST["verified"]


def _file_differences():
    for rel, digest in sorted(MANIFEST["files"].items()):
        try:
            with open(os.path.join(_HERE, rel), "rb") as f:
                actual = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            return "%s cannot be read (%s)" % (rel, e.strerror)
        if actual != digest:
            return "%s differs from the manifest (sha256 %s, exported %s): the package was changed after export" % (
                rel, actual[:16], digest[:16])
    return None


def _load(name, shim):
    spec = importlib.util.spec_from_file_location(__name__ + "." + name, os.path.join(_HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("cuda_agent")
    if shim:
        sys.modules["cuda_agent"] = _runtime  # the solution's `import cuda_agent`
    try:
        spec.loader.exec_module(module)
    finally:
        if shim:
            if saved is None:
                sys.modules.pop("cuda_agent", None)
            else:
                sys.modules["cuda_agent"] = saved
    return module


_tampered = _file_differences()
if _tampered and _tampered.startswith("reference.py"):
    raise ImportError("%s: %s; the fallback cannot be trusted, export the solution again" % (__name__, _tampered))
reference = _load("reference", shim=False)
get_inputs = reference.get_inputs
get_init_inputs = reference.get_init_inputs


def _initial_mode():
    if os.environ.get("CUDA_AGENT_EXPORT_FALLBACK", "") not in ("", "0"):
        return "fallback", "CUDA_AGENT_EXPORT_FALLBACK is set"
    if _tampered:
        return "fallback", _tampered
    try:
        state = _read_json("state.json")
    except (OSError, ValueError):
        state = {"mode": "kernel"}
    if state.get("mode") == "fallback":
        return "fallback", "rolled back: %s" % state.get("reason", "no reason recorded")
    return "kernel", None


_mode, _disabled_reason = _initial_mode()
solution = None
if _mode == "kernel":
    try:
        solution = _load("solution", shim=True)
    except Exception as e:  # the package still works: through its fallback
        _mode, _disabled_reason = "fallback", "the solution failed to import: %s: %s" % (type(e).__name__, e)

_TORCH_REASON = _guard.check_torch(VERIFIED["torch"])
_stats_lock = threading.Lock()
_stats = {"calls": 0, "kernel_calls": 0, "fallbacks": {}}
_warned = set()


def mode():
    """'kernel', or 'fallback' (then reason() says why)."""
    return _mode


def reason():
    return _disabled_reason


def stats():
    """Calls, calls the kernels ran, and fallbacks by reason, since import (or reset_stats())."""
    with _stats_lock:
        return {"calls": _stats["calls"], "kernel_calls": _stats["kernel_calls"],
                "fallbacks": dict(_stats["fallbacks"])}


def reset_stats():
    with _stats_lock:
        _stats.update(calls=0, kernel_calls=0, fallbacks={})


def _count(reason_text):
    with _stats_lock:
        _stats["calls"] += 1
        if reason_text is None:
            _stats["kernel_calls"] += 1
            return
        _stats["fallbacks"][reason_text] = _stats["fallbacks"].get(reason_text, 0) + 1
        first = reason_text not in _warned
        _warned.add(reason_text)
    if first:
        warnings.warn("%s: running the fallback (%s): %s" % (__name__, MANIFEST["fallback"], reason_text),
                      RuntimeWarning, stacklevel=3)


def _tie(fast, own):
    """Makes `fast` (the solution's module) use `own`'s parameters and buffers where names and
    shapes agree; returns the names of fast's that stay its own."""
    own_params, own_buffers = dict(own.named_parameters()), dict(own.named_buffers())
    untied = []
    for table, named, attr in ((own_params, list(fast.named_parameters()), "_parameters"),
                               (own_buffers, list(fast.named_buffers()), "_buffers")):
        for name, value in named:
            mine = table.get(name)
            if mine is None or mine.shape != value.shape or mine.dtype != value.dtype:
                untied.append(name)
                continue
            owner = fast.get_submodule(name.rpartition(".")[0]) if "." in name else fast
            getattr(owner, attr)[name.rpartition(".")[2]] = mine
    return untied


class Model(reference.Model):
    """The task's Model with the exported kernels behind a guard."""

    def __init__(self, *args, **kwargs):
        rng = torch.get_rng_state()
        super().__init__(*args, **kwargs)
        after = torch.get_rng_state()
        fast, untied = None, []
        if _mode == "kernel":
            torch.set_rng_state(rng)  # the same draws as the reference's: untied weights agree
            fast = solution.ModelNew(*args, **kwargs)
            torch.set_rng_state(after)
            untied = _tie(fast, self)
        object.__setattr__(self, "_fast", fast)
        object.__setattr__(self, "_compiled", None)
        self.untied = untied  # the solution's own parameters: weights loaded here do not reach them

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        if self._fast is not None:
            self._fast._apply(fn, *args, **kwargs)
        return self

    def train(self, mode=True):
        super().train(mode)
        if self._fast is not None:
            self._fast.train(mode)
        return self

    def fallback_forward(self, *inputs):
        """The fallback alone: the reference under torch.compile, or eager."""
        if MANIFEST["fallback"] == "compile":
            if self._compiled is None:
                object.__setattr__(self, "_compiled",
                                   torch.compile(lambda *x: reference.Model.forward(self, *x)))
            try:
                return self._compiled(*inputs)
            except Exception as e:
                out = reference.Model.forward(self, *inputs)  # raises what the call itself gets wrong
                # Eager runs it: torch.compile cannot build here, so eager from now on.
                object.__setattr__(self, "_compiled", lambda *x: reference.Model.forward(self, *x))
                warnings.warn("%s: torch.compile failed (%s: %s); the fallback runs eager" % (
                    __name__, type(e).__name__, str(e).splitlines()[0] if str(e) else ""), RuntimeWarning)
                return out
        return reference.Model.forward(self, *inputs)

    def kernel_reason(self, *inputs):
        """None when this call would run the kernels, else why not."""
        if self._fast is None:
            return _disabled_reason
        return (_TORCH_REASON or _guard.check_inputs(MANIFEST["inputs"], inputs)
                or _guard.check_placement(inputs, VERIFIED["arch"]))

    def forward(self, *inputs):
        why = self.kernel_reason(*inputs)
        if why is None:
            try:
                out = self._fast(*inputs)
            except _runtime.KernelNotExported as e:
                why = str(e)
            else:
                _count(None)
                return out
        _count(why)
        return self.fallback_forward(*inputs)


ModelNew = Model

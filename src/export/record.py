# Run by `cuda-agent export` in a plain Python: imports the solution with a recording
# `cuda_agent` in place of the sandbox's, so that every program it compiles at import is known
# (source, name expressions, options), and describes the task's inputs (drawn on the meta device
# where the task allows it: shapes and dtypes without the memory).
#   python record.py PACKAGE_DIR TASK SOLUTION OUT_JSON
import importlib.util
import json
import sys
import types

import torch

package_dir, task_path, solution_path, out_path = sys.argv[1:5]
sys.path.insert(0, package_dir)
import _guard  # noqa: E402  (the package's own, written before this runs)
import _runtime  # noqa: E402

programs = []


class _RecordedKernel:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError("kernel '%s' launched while the export imports the solution: export records what "
                           "the solution compiles at import and launches nothing" % self.name)

    launch = __call__

    def set_max_dynamic_shared_memory(self, size):
        pass

    def attribute(self, which):
        return 0


class _RecordedModule:
    def __init__(self, index):
        self.index = index

    def get_function(self, name):
        programs[self.index]["functions"].append(name)
        return _RecordedKernel(name)

    kernel_names = property(lambda self: [])
    from_cache = property(lambda self: False)
    log = property(lambda self: "")
    cubin_size = property(lambda self: 0)


def _compile(source, name_expressions=None, options=None, arch=""):
    programs.append({"source": source, "name_expressions": list(name_expressions or []),
                     "options": list(options or []), "arch": arch, "functions": [],
                     "digest": _runtime.program_digest(source, name_expressions, options)})
    return _RecordedModule(len(programs) - 1)


def _unused(*args, **kwargs):
    raise RuntimeError("a vendor call while the export imports the solution")


recorder = types.ModuleType("cuda_agent")
recorder.compile, recorder.gemm, recorder.conv2d = _compile, _unused, _unused
recorder.CompileError, recorder.Error = _runtime.CompileError, _runtime.Error
recorder.target_arch = lambda: "sm_90"
recorder.nvrtc_version = lambda: 0
sys.modules["cuda_agent"] = recorder


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


task = load("exported_task", task_path)
solution = load("exported_solution", solution_path)
if not hasattr(solution, "ModelNew"):
    raise SystemExit("%s defines no ModelNew" % solution_path)
try:
    with torch.device("meta"):
        inputs = task.get_inputs()
except Exception:
    inputs = task.get_inputs()
init_inputs = task.get_init_inputs()
with open(out_path, "w") as f:
    json.dump({"programs": programs, "inputs": [_guard.describe(x) for x in inputs],
               "init_inputs": [_guard.describe(x) for x in init_inputs]}, f)

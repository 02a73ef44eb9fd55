// The embedded `cuda_agent` module: NVRTC compile, typed kernel launches, vendor calls.
#include "cuda_agent/sandbox/python_module.h"

#include <algorithm>
#include <memory>

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/kernel_signature.h"
#include "cuda_agent/sandbox/nvrtc_compiler.h"
#include "cuda_agent/sandbox/python_tensor.h"
#include "cuda_agent/sandbox/vendor_calls.h"

namespace py = pybind11;

namespace cuda_agent::sandbox {
namespace {

std::filesystem::path g_cache_dir;
std::string g_arch;

NvrtcCompiler& compiler() {
  static NvrtcCompiler instance(g_cache_dir.empty() ? default_cache_dir() / "nvrtc" : g_cache_dir);
  return instance;
}

std::string target_arch() {
  if (!g_arch.empty()) return g_arch;
  if (gpu_available()) g_arch = current_device_info().arch();
  else g_arch = "sm_90";
  return g_arch;
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A compiled program; loaded into the current context on first use.
class LoadedModule {
 public:
  explicit LoadedModule(CompiledProgram program) : program_(std::move(program)) {}
  ~LoadedModule() {
    // Modules may outlive the context at interpreter shutdown; unloading then is pointless.
    if (module_ && !interpreter_finalizing()) driver().cuModuleUnload(module_);
  }
  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;

  CUmodule module() {
    if (!module_) {
      ensure_context();
      CA_CU_CHECK(driver().cuModuleLoadData(&module_, program_.cubin.data()));
    }
    return module_;
  }
  const CompiledProgram& program() const { return program_; }
  std::vector<KernelSignature> extern_c;

 private:
  CompiledProgram program_;
  CUmodule module_ = nullptr;
};

std::vector<unsigned> parse_dims(py::handle obj, const char* what, const std::string& kernel) {
  std::vector<unsigned> dims;
  auto take = [&](py::handle v) {
    CA_CHECK(py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v),
             "kernel '{}': {} must be an int or a tuple of up to 3 ints, got {}", kernel, what,
             py::str(py::type::of(v)).cast<std::string>());
    long long x = v.cast<long long>();
    CA_CHECK(x >= 1 && x <= 0x7fffffffLL, "kernel '{}': {} dimension {} is out of range (1..2^31-1)",
             kernel, what, x);
    dims.push_back(static_cast<unsigned>(x));
  };
  if (py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) {
    for (auto v : obj) take(v);
  } else {
    take(obj);
  }
  CA_CHECK(!dims.empty() && dims.size() <= 3, "kernel '{}': {} must have 1 to 3 dimensions, got {}",
           kernel, what, dims.size());
  while (dims.size() < 3) dims.push_back(1);
  return dims;
}

// A grid or block given as an int or a tuple/list of up to three ints, read through the C API;
// false for anything else (parse_dims then says what is wrong).
bool fast_dims(PyObject* obj, unsigned* out) {
  auto one = [](PyObject* v, unsigned* d) {
    if (!PyLong_CheckExact(v)) return false;
    const long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    if (x < 1 || x > 0x7fffffffLL) return false;
    *d = static_cast<unsigned>(x);
    return true;
  };
  out[0] = out[1] = out[2] = 1;
  if (PyLong_CheckExact(obj)) return one(obj, out);
  const bool tuple = PyTuple_CheckExact(obj);
  if (!tuple && !PyList_CheckExact(obj)) return false;
  const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
  if (n < 1 || n > 3) return false;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!one(tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i), out + i)) return false;
  return true;
}

class Kernel {
 public:
  Kernel(std::shared_ptr<LoadedModule> module, std::string name, std::string symbol, KernelSignature signature)
      : module_(std::move(module)),
        name_(std::move(name)),
        symbol_(std::move(symbol)),
        signature_(std::move(signature)) {
    // One buffer for every argument's bytes, each at its own 8-byte aligned offset.
    size_t offset = 0;
    for (const auto& p : signature_.params) {
      offsets_.push_back(offset);
      offset += (p.value_size() + 7) / 8 * 8;
    }
    arguments_.assign(std::max<size_t>(offset, 8), 0);
    pointers_.resize(signature_.params.size());
  }

  CUfunction function() {
    if (!function_) CA_CU_CHECK(driver().cuModuleGetFunction(&function_, module_->module(), symbol_.c_str()));
    return function_;
  }

  // The launch path: a few C-API calls per argument, the checks of the slow path (grid and block
  // ranges, argument count and types, dtype, device, contiguity, alignment) made without building
  // strings; a value that fails one goes through the slow path for its error message.
  void launch(py::handle grid, py::handle block, py::handle args, size_t shared_mem, py::handle stream) {
    unsigned g[3], b[3];
    if (!fast_dims(grid.ptr(), g)) std::copy_n(parse_dims(grid, "grid", name_).begin(), 3, g);
    if (!fast_dims(block.ptr(), b)) std::copy_n(parse_dims(block, "block", name_).begin(), 3, b);
    PyObject* a = args.ptr();
    const bool tuple = PyTuple_Check(a);
    CA_CHECK(tuple || PyList_Check(a), "kernel '{}': args must be a tuple of the kernel's arguments, got {}", name_,
             py::str(py::type::of(args)).cast<std::string>());
    const size_t n = static_cast<size_t>(tuple ? PyTuple_GET_SIZE(a) : PyList_GET_SIZE(a));
    CA_CHECK(n == signature_.params.size(), "kernel '{}' takes {} arguments ({}), got {}", name_,
             signature_.params.size(), describe(signature_), n);
    for (size_t i = 0; i < n; ++i) {
      const auto at = static_cast<Py_ssize_t>(i);  // read each time: the list could change under us
      CA_CHECK(tuple || at < PyList_GET_SIZE(a), "kernel '{}': its args list changed during the launch", name_);
      py::handle value(tuple ? PyTuple_GET_ITEM(a, at) : PyList_GET_ITEM(a, at));
      encode_kernel_argument_into(signature_.params[i], value, i, name_, arguments_.data() + offsets_[i]);
      pointers_[i] = arguments_.data() + offsets_[i];
    }
    CUstream s = stream.is_none() ? current_torch_stream() : stream_from_python(stream);
    CUfunction f = function();
    CUresult status;
    {
      LaunchScope tag(LaunchOrigin::kOwn);
      status = driver().cuLaunchKernel(f, g[0], g[1], g[2], b[0], b[1], b[2], static_cast<unsigned>(shared_mem), s,
                                       pointers_.data(), nullptr);
    }
    if (status != CUDA_SUCCESS) {
      CA_FAIL("launching kernel '{}' with grid ({}, {}, {}), block ({}, {}, {}), shared_mem {} failed: {}",
              name_, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, detail::driver_error_text(status));
    }
    if (!launch_count_) launch_count_ = &runtime_stats().launches[symbol_];
    ++*launch_count_;
  }

  void set_max_dynamic_shared_memory(int bytes) {
    CA_CU_CHECK(driver().cuFuncSetAttribute(function(), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
  }

  int attribute(const std::string& which) {
    CUfunction_attribute attr;
    if (which == "num_regs") attr = CU_FUNC_ATTRIBUTE_NUM_REGS;
    else if (which == "shared_size_bytes") attr = CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES;
    else if (which == "local_size_bytes") attr = CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES;
    else if (which == "max_threads_per_block") attr = CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
    else CA_FAIL("unknown kernel attribute '{}': use num_regs, shared_size_bytes, local_size_bytes or max_threads_per_block", which);
    int value = 0;
    CA_CU_CHECK(driver().cuFuncGetAttribute(&value, attr, function()));
    return value;
  }

  std::string repr() const { return "<cuda_agent.Kernel " + describe(signature_) + ">"; }
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<LoadedModule> module_;
  std::string name_;
  std::string symbol_;
  KernelSignature signature_;
  CUfunction function_ = nullptr;
  // The launch's scratch (the GIL is held from the first argument read to cuLaunchKernel, which
  // copies the arguments): each argument's bytes and the pointers cuLaunchKernel takes.
  std::vector<size_t> offsets_;
  std::vector<uint8_t> arguments_;
  std::vector<void*> pointers_;
  int64_t* launch_count_ = nullptr;  // runtime_stats().launches[symbol_] (a map node: stable)
};

class Module {
 public:
  explicit Module(std::shared_ptr<LoadedModule> loaded) : loaded_(std::move(loaded)) {}

  Kernel get_function(const std::string& name) {
    const CompiledProgram& program = loaded_->program();
    auto lowered = program.lowered_names.find(name);
    if (lowered != program.lowered_names.end())
      return Kernel(loaded_, name, lowered->second, signature_from_lowered_name(lowered->second));
    for (const auto& sig : loaded_->extern_c)
      if (sig.name == name) return Kernel(loaded_, name, name, sig);
    std::vector<std::string> known;
    for (const auto& sig : loaded_->extern_c) known.push_back(sig.name);
    for (const auto& [expr, _] : program.lowered_names) known.push_back(expr);
    CA_FAIL("no kernel named '{}' in this module; it has: {}. Kernels need extern \"C\" __global__, "
            "or pass template instantiations as name_expressions to compile()",
            name, known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", ")));
  }

  std::vector<std::string> kernel_names() const {
    std::vector<std::string> names;
    for (const auto& sig : loaded_->extern_c) names.push_back(sig.name);
    for (const auto& [expr, _] : loaded_->program().lowered_names) names.push_back(expr);
    return names;
  }
  std::string log() const { return loaded_->program().log; }
  bool from_cache() const { return loaded_->program().from_cache; }
  size_t cubin_size() const { return loaded_->program().cubin.size(); }

 private:
  std::shared_ptr<LoadedModule> loaded_;
};

[[noreturn]] void raise_compile_error(const std::string& report, const std::string& log,
                                      const std::string& numbered_source) {
  static py::object error_type = py::module_::import("cuda_agent").attr("CompileError");
  py::object error = error_type(report);
  error.attr("log") = log;
  error.attr("numbered_source") = numbered_source;
  PyErr_SetObject(error_type.ptr(), error.ptr());
  throw py::error_already_set();
}

Module compile(const std::string& source, std::optional<std::vector<std::string>> name_expressions,
               std::optional<std::vector<std::string>> options, const std::string& arch) {
  CompileOptions opts;
  opts.arch = arch.empty() ? target_arch() : arch;
  if (name_expressions) opts.name_expressions = *name_expressions;
  if (options) opts.options = *options;
  // Signatures first: a kernel we cannot type is a compile error too, reported before NVRTC.
  std::vector<KernelSignature> extern_c;
  try {
    extern_c = parse_extern_c_kernels(source);
  } catch (const Error& e) {
    raise_compile_error(e.what(), e.what(), NvrtcCompiler::number_lines(source));
  }
  CompiledProgram program = compiler().compile(source, opts);
  if (!program.ok) raise_compile_error(program.error_report(), program.log, program.numbered_source);
  RuntimeStats& stats = runtime_stats();
  if (program.from_cache) stats.cache_hits++;
  else {
    stats.compiles++;
    stats.compile_seconds += program.compile_seconds;
  }
  for (const auto& sig : extern_c) stats.compiled_kernels.insert(sig.name);
  for (const auto& [_, lowered] : program.lowered_names) stats.compiled_kernels.insert(lowered);
  auto loaded = std::make_shared<LoadedModule>(std::move(program));
  loaded->extern_c = std::move(extern_c);
  return Module(loaded);
}

}  // namespace

RuntimeStats& runtime_stats() {
  static RuntimeStats stats;
  return stats;
}

void set_runtime_cache_dir(const std::filesystem::path& dir) { g_cache_dir = dir; }
void set_runtime_trusted_entries(std::map<std::string, std::string> digests) {
  compiler().trust_only(std::move(digests));
}
std::map<std::string, std::string> runtime_written_entries() {
  return compiler().written_entries();
}
void set_runtime_arch(const std::string& arch) { g_arch = arch; }
void register_python_module() {}

CompiledProgram compile_private_program(const std::string& source, const std::string& arch) {
  CompileOptions opts;
  opts.arch = arch;
  return NvrtcCompiler(std::filesystem::path()).compile(source, opts);  // no cache folder: memory only
}

py::object private_module(CompiledProgram program, const std::string& source) {
  CA_CHECK(program.ok, "compiling the judge's own kernels failed: {}", program.error_report());
  (void)py::module_::import("cuda_agent");  // Module's Python type
  auto loaded = std::make_shared<LoadedModule>(std::move(program));
  loaded->extern_c = parse_extern_c_kernels(source);
  return py::cast(Module(loaded));
}

py::object compile_private(const std::string& source) {
  return private_module(compile_private_program(source, target_arch()), source);
}

void bind_vendor_calls(py::module_& m);  // python_vendor_calls.cpp

}  // namespace cuda_agent::sandbox

PYBIND11_EMBEDDED_MODULE(cuda_agent, m) {
  using namespace cuda_agent::sandbox;
  m.doc() = "The cuda-agent sandbox runtime: NVRTC compilation, typed kernel launches, vendor calls.";
  struct CompileErrorTag {};
  static py::exception<CompileErrorTag> compile_error(m, "CompileError", PyExc_RuntimeError);
  (void)compile_error;
  py::register_exception<cuda_agent::Error>(m, "Error", PyExc_RuntimeError);

  py::class_<Kernel>(m, "Kernel")
      .def("__call__", &Kernel::launch, py::arg("grid"), py::arg("block"), py::arg("args"),
           py::arg("shared_mem") = 0, py::arg("stream") = py::none())
      .def("launch", &Kernel::launch, py::arg("grid"), py::arg("block"), py::arg("args"),
           py::arg("shared_mem") = 0, py::arg("stream") = py::none())
      .def("set_max_dynamic_shared_memory", &Kernel::set_max_dynamic_shared_memory)
      .def("attribute", &Kernel::attribute)
      .def_property_readonly("name", &Kernel::name)
      .def("__repr__", &Kernel::repr);
  py::class_<Module>(m, "Module")
      .def("get_function", &Module::get_function)
      .def_property_readonly("kernel_names", &Module::kernel_names)
      .def_property_readonly("log", &Module::log)
      .def_property_readonly("from_cache", &Module::from_cache)
      .def_property_readonly("cubin_size", &Module::cubin_size);
  m.def("compile", &compile, py::arg("source"), py::arg("name_expressions") = py::none(),
        py::arg("options") = py::none(), py::arg("arch") = "",
        "Compile CUDA C++ with NVRTC for this GPU (cached); raises CompileError with the log.");
  m.def("nvrtc_version", [] { return NvrtcCompiler::nvrtc_version(); });
  m.def("target_arch", [] { return target_arch(); });
  bind_vendor_calls(m);
}

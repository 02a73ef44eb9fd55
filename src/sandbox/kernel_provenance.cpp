#include "cuda_agent/sandbox/kernel_provenance.h"

#include <atomic>
#include <cctype>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"

namespace cuda_agent::sandbox {
namespace {

std::atomic<bool> g_active{false};

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

ProvenanceScope::ProvenanceScope(LaunchOrigin origin) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  pushed_ = cupti().cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                           static_cast<uint64_t>(origin)) == CUPTI_SUCCESS;
}

ProvenanceScope::~ProvenanceScope() {
  if (pushed_) cupti().cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr);
}

std::string kernel_base_name(const std::string& demangled) {
  std::string s = demangled;
  // Cut the parameter list: the first '(' at template depth 0.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  // Cut trailing template arguments.
  if (!s.empty() && s.back() == '>') {
    depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == '>') ++depth;
      else if (s[i] == '<' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  size_t end = s.size();
  while (end > 0 && !is_ident(s[end - 1])) --end;
  size_t begin = end;
  while (begin > 0 && is_ident(s[begin - 1])) --begin;
  return s.substr(begin, end - begin);
}

std::set<std::string> global_kernel_names(const std::string& source) {
  std::set<std::string> names;
  const std::string key = "__global__";
  for (size_t pos = source.find(key); pos != std::string::npos; pos = source.find(key, pos + key.size())) {
    // The declared name is the identifier right before the first '(' that is not part of an
    // attribute such as __launch_bounds__(...).
    size_t i = pos + key.size();
    while (i < source.size()) {
      const size_t paren = source.find('(', i);
      if (paren == std::string::npos) break;
      size_t end = paren;
      while (end > i && std::isspace(static_cast<unsigned char>(source[end - 1]))) --end;
      size_t begin = end;
      while (begin > i && is_ident(source[begin - 1])) --begin;
      const std::string ident = source.substr(begin, end - begin);
      if (ident == "__launch_bounds__" || ident == "__cluster_dims__" || ident == "__maxnreg__" ||
          ident == "__attribute__" || ident == "alignas") {
        // Skip the attribute's balanced parentheses.
        int depth = 0;
        size_t j = paren;
        for (; j < source.size(); ++j) {
          if (source[j] == '(') ++depth;
          else if (source[j] == ')' && --depth == 0) break;
        }
        i = j + 1;
        continue;
      }
      if (!ident.empty()) names.insert(ident);
      break;
    }
  }
  return names;
}

std::string ProvenanceReport::message() const {
  if (!forbidden.empty()) {
    std::string list;
    for (const auto& [name, n] : forbidden) list += fmt::format("{}{} (x{})", list.empty() ? "" : "; ", name, n);
    return fmt::format(
        "ModelNew.forward ran kernels the solution did not compile (PyTorch/ATen, Triton or library code): {}. "
        "The computation must run in kernels compiled with cuda_agent.compile (or the nvcc path) or in the named "
        "calls cuda_agent.gemm / cuda_agent.conv2d; fills and copies are allowed",
        list);
  }
  if (host_copy_bytes > kHostCopyLimit)
    return fmt::format("ModelNew.forward copied {} bytes from the GPU to the host: computing on the host (NumPy, "
                       "Python, .cpu()) is not allowed; the computation must run in the solution's own kernels",
                       host_copy_bytes);
  if (own + vendor == 0)
    return "none of the solution's own kernels ran in ModelNew.forward (a decoy kernel or no kernel at all): the "
           "output must be computed by kernels the solution compiled";
  return "";
}

void ProvenanceReport::merge(const ProvenanceReport& o) {
  own += o.own;
  vendor += o.vendor;
  allowed += o.allowed;
  for (const auto& [k, v] : o.own_names) own_names[k] += v;
  for (const auto& [k, v] : o.forbidden) forbidden[k] += v;
  host_copy_bytes += o.host_copy_bytes;
  if (o.attribution != "external_correlation") attribution = o.attribution;
}

nlohmann::json ProvenanceReport::to_json() const {
  return {{"own_launches", own},         {"vendor_launches", vendor}, {"allowed_launches", allowed},
          {"own_kernels", own_names},    {"forbidden_kernels", forbidden}, {"host_copy_bytes", host_copy_bytes},
          {"attribution", attribution},  {"violation", violates() ? message() : ""}};
}

ProvenanceReport classify_kernels(const std::vector<KernelRecord>& records, const std::vector<std::string>& allow,
                                  const std::set<std::string>& source_names, const std::set<std::string>& runtime_names,
                                  bool have_external) {
  ProvenanceReport r;
  if (!have_external) r.attribution = "names";
  for (const auto& k : records) {
    const std::string base = kernel_base_name(k.name);
    if (k.external_id == static_cast<uint64_t>(LaunchOrigin::kOwnKernel) ||
        (!have_external && runtime_names.count(base)) || source_names.count(base)) {
      ++r.own;
      ++r.own_names[k.name];
    } else if (k.external_id == static_cast<uint64_t>(LaunchOrigin::kVendorCall)) {
      ++r.vendor;
    } else {
      bool ok = false;
      for (const auto& a : allow) ok = ok || (!a.empty() && k.name.find(a) != std::string::npos);
      if (ok) ++r.allowed;
      else ++r.forbidden[k.name];
    }
  }
  return r;
}

void ProvenanceRecorder::begin() {
  CuptiKernelRecorder::instance().start(/*attribute=*/true);
  g_active.store(true);
}

std::vector<KernelRecord> ProvenanceRecorder::end(bool* have_external, uint64_t* host_copy_bytes) {
  g_active.store(false);
  CuptiKernelRecorder& rec = CuptiKernelRecorder::instance();
  std::vector<KernelRecord> records = rec.stop();
  if (have_external) *have_external = rec.external_correlations() > 0;
  if (host_copy_bytes) *host_copy_bytes = rec.host_copy_bytes();
  return records;
}

}  // namespace cuda_agent::sandbox

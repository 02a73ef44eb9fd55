#include "cuda_agent/sandbox/kernel_provenance.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include "cuda_agent/core/error.h"

namespace cuda_agent::sandbox {
namespace {

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string dims(const int32_t d[3]) { return fmt::format("{}x{}x{}", d[0], d[1], d[2]); }

std::string forbidden_key(const KernelUse& u) {
  return u.library.empty() ? fmt::format("{} [{}]", u.name, to_string(u.origin))
                           : fmt::format("{} [{}: {}]", u.name, to_string(u.origin), u.library);
}

}  // namespace

nlohmann::json KernelUse::to_json() const {
  return {{"name", name},     {"origin", to_string(origin)}, {"library", library}, {"calls", calls},
          {"total_us", total_us}, {"streams", std::vector<uint32_t>(streams.begin(), streams.end())},
          {"grid", grid},     {"block", block}};
}

KernelUse KernelUse::from_json(const nlohmann::json& j) {
  KernelUse u;
  u.name = j.at("name").get<std::string>().substr(0, 4096);
  u.origin = launch_origin_from_string(j.at("origin").get<std::string>());
  u.library = j.value("library", "").substr(0, 512);
  u.calls = j.at("calls").get<int64_t>();
  u.total_us = j.at("total_us").get<double>();
  for (const auto& s : j.value("streams", nlohmann::json::array())) u.streams.insert(s.get<uint32_t>());
  u.grid = j.value("grid", "");
  u.block = j.value("block", "");
  CA_CHECK(u.calls >= 0 && u.total_us >= 0, "a kernel entry with negative counts");
  return u;
}

std::vector<KernelUse> summarize_kernels(const std::vector<KernelRecord>& records) {
  std::map<std::tuple<std::string, LaunchOrigin, std::string>, KernelUse> by_key;
  for (const auto& r : records) {
    KernelUse& u = by_key[{r.name, r.origin, r.library}];
    u.name = r.name;
    u.origin = r.origin;
    u.library = r.library;
    u.calls++;
    u.total_us += (r.end_ns - r.start_ns) / 1e3;
    u.streams.insert(r.stream_id);
    u.grid = dims(r.grid);
    u.block = dims(r.block);
  }
  std::vector<KernelUse> out;
  for (auto& [key, u] : by_key) out.push_back(std::move(u));
  return out;
}

void merge_kernel_uses(std::vector<KernelUse>& into, const std::vector<KernelUse>& more) {
  for (const KernelUse& m : more) {
    auto it = std::find_if(into.begin(), into.end(), [&](const KernelUse& u) {
      return u.name == m.name && u.origin == m.origin && u.library == m.library;
    });
    if (it == into.end()) {
      into.push_back(m);
      continue;
    }
    it->calls += m.calls;
    it->total_us += m.total_us;
    it->streams.insert(m.streams.begin(), m.streams.end());
    it->grid = m.grid;
    it->block = m.block;
  }
}

nlohmann::json kernel_table(const std::vector<KernelUse>& uses, int runs) {
  nlohmann::json table = nlohmann::json::array();
  for (const auto& u : uses) {
    if (u.origin == LaunchOrigin::kHarness) continue;
    table.push_back({{"name", u.name},
                     {"origin", to_string(u.origin)},
                     {"calls_per_forward", runs > 0 ? static_cast<double>(u.calls) / runs : 0.0},
                     {"mean_us", u.calls > 0 ? u.total_us / u.calls : 0.0},
                     {"total_us_per_forward", runs > 0 ? u.total_us / runs : 0.0},
                     {"streams", std::vector<uint32_t>(u.streams.begin(), u.streams.end())},
                     {"grid", u.grid},
                     {"block", u.block}});
  }
  std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) {
    return a["total_us_per_forward"].template get<double>() > b["total_us_per_forward"].template get<double>();
  });
  return table;
}

bool has_identifier(const std::string& name, const std::string& identifier) {
  if (identifier.empty()) return false;
  for (size_t pos = name.find(identifier); pos != std::string::npos; pos = name.find(identifier, pos + 1)) {
    const bool starts = pos == 0 || !is_ident(name[pos - 1]);
    const size_t end = pos + identifier.size();
    const bool ends = end == name.size() || !is_ident(name[end]);
    if (starts && ends) return true;
  }
  return false;
}

bool ProvenanceReport::violates() const {
  return !forbidden.empty() || own + vendor == 0 || host_copy_bytes > kHostCopyLimit ||
         allowed_us > kAllowedTimeFactor * (own_us + vendor_us) + 1.0;
}

std::string ProvenanceReport::message() const {
  if (!forbidden.empty()) {
    std::string list;
    for (const auto& [name, n] : forbidden) list += fmt::format("{}{} (x{})", list.empty() ? "" : "; ", name, n);
    return fmt::format(
        "ModelNew.forward ran kernels the solution did not launch (PyTorch/ATen, Triton or library code): {}. The "
        "computation must run in kernels launched with cuda_agent.compile, built through the nvcc path, or in the "
        "named calls cuda_agent.gemm / cuda_agent.conv2d; PyTorch's fills and copies are allowed",
        list);
  }
  if (host_copy_bytes > kHostCopyLimit)
    return fmt::format("ModelNew.forward copied {} bytes from the GPU to the host: computing on the host (NumPy, "
                       "Python, .cpu()) is not allowed; the computation must run in the solution's own kernels",
                       host_copy_bytes);
  if (own + vendor == 0)
    return "none of the solution's own kernels ran in ModelNew.forward (no kernel at all, or only PyTorch's fills and "
           "copies): the output must be computed by kernels the solution launched";
  if (allowed_us > kAllowedTimeFactor * (own_us + vendor_us) + 1.0)
    return fmt::format("PyTorch's fills and copies took {:.1f} us of GPU time against {:.1f} us for the solution's own "
                       "kernels: the work was done by PyTorch, with a decoy kernel beside it",
                       allowed_us, own_us + vendor_us);
  return "";
}

void ProvenanceReport::merge(const ProvenanceReport& o) {
  own += o.own;
  vendor += o.vendor;
  allowed += o.allowed;
  own_us += o.own_us;
  vendor_us += o.vendor_us;
  allowed_us += o.allowed_us;
  for (const auto& [k, v] : o.own_names) own_names[k] += v;
  for (const auto& [k, v] : o.forbidden) forbidden[k] += v;
  host_copy_bytes += o.host_copy_bytes;
}

nlohmann::json ProvenanceReport::to_json() const {
  return {{"own_launches", own},         {"vendor_launches", vendor},        {"allowed_launches", allowed},
          {"own_us", own_us},            {"vendor_us", vendor_us},           {"allowed_us", allowed_us},
          {"own_kernels", own_names},    {"forbidden_kernels", forbidden},   {"host_copy_bytes", host_copy_bytes},
          {"attribution", "correlation"}, {"violation", violates() ? message() : ""}};
}

ProvenanceReport classify_kernels(const std::vector<KernelUse>& uses, const std::vector<std::string>& allow) {
  ProvenanceReport r;
  for (const auto& u : uses) {
    switch (u.origin) {
      case LaunchOrigin::kOwn:
      case LaunchOrigin::kOwnNvcc:
        r.own += u.calls;
        r.own_us += u.total_us;
        r.own_names[u.name] += u.calls;
        break;
      case LaunchOrigin::kVendor:
        r.vendor += u.calls;
        r.vendor_us += u.total_us;
        break;
      case LaunchOrigin::kHarness:
        break;
      case LaunchOrigin::kTorch:
        if (std::any_of(allow.begin(), allow.end(), [&](const std::string& a) { return has_identifier(u.name, a); })) {
          r.allowed += u.calls;
          r.allowed_us += u.total_us;
          break;
        }
        [[fallthrough]];
      default:
        r.forbidden[forbidden_key(u)] += u.calls;
    }
  }
  return r;
}

}  // namespace cuda_agent::sandbox

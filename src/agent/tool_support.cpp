#include "tool_support.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <mutex>
#include <system_error>

#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/worker_confinement.h"

namespace cuda_agent::agent {

namespace fs = std::filesystem;

ToolResult tool_error(std::string message, nlohmann::json data) {
  ToolResult result;
  result.ok = false;
  result.output = std::move(message);
  result.data = std::move(data);
  return result;
}

nlohmann::json function_schema(const std::string& name, const std::string& description,
                               nlohmann::json properties, std::vector<std::string> required) {
  nlohmann::json parameters = {{"type", "object"},
                               {"properties", std::move(properties)},
                               {"required", std::move(required)},
                               {"additionalProperties", false}};
  return {{"type", "function"},
          {"function",
           {{"name", name}, {"description", description}, {"parameters", parameters}}}};
}

bool has_arg(const nlohmann::json& args, const char* key) {
  return args.is_object() && args.contains(key) && !args.at(key).is_null();
}

std::string string_arg(const nlohmann::json& args, const char* key, std::string fallback) {
  return has_arg(args, key) && args.at(key).is_string() ? args.at(key).get<std::string>()
                                                        : fallback;
}

int64_t int_arg(const nlohmann::json& args, const char* key, int64_t fallback) {
  if (!has_arg(args, key)) return fallback;
  const auto& value = args.at(key);
  if (value.is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(value.get<uint64_t>(), INT64_MAX));
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (!std::isfinite(number)) return fallback;
    return static_cast<int64_t>(std::clamp(number, -9.0e18, 9.0e18));
  }
  return fallback;
}

double number_arg(const nlohmann::json& args, const char* key, double fallback) {
  return has_arg(args, key) && args.at(key).is_number() ? args.at(key).get<double>() : fallback;
}

bool bool_arg(const nlohmann::json& args, const char* key, bool fallback) {
  return has_arg(args, key) && args.at(key).is_boolean() ? args.at(key).get<bool>() : fallback;
}

namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 when it is not one.
size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint32_t min = 0;
  uint32_t code = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, min = 0x80, code = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, min = 0x800, code = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, min = 0x10000, code = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

// Moves `cut` back to the start of a UTF-8 sequence (off a continuation byte).
size_t char_boundary(std::string_view text, size_t cut) {
  size_t back = 0;
  while (cut > 0 && cut < text.size() && back < 3 &&
         (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
    ++back;
  }
  return cut;
}

// Length of `text` without a UTF-8 sequence cut off at its end.
size_t complete_prefix(std::string_view text) {
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    return need > back ? text.size() - back : text.size();
  }
  return text.size();
}

}  // namespace

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

std::string truncate_output(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  const size_t keep = max_chars > 200 ? max_chars - 100 : max_chars / 2;  // room for the notice
  const size_t head_end = char_boundary(text, keep / 2);
  const size_t tail_begin = char_boundary(text, text.size() - (keep - keep / 2));
  return fmt::format("{}\n[... {} characters truncated ...]\n{}", text.substr(0, head_end),
                     tail_begin - head_end, text.substr(tail_begin));
}

std::string display_path(const Workspace& workspace, const fs::path& absolute) {
  const fs::path relative = absolute.lexically_normal().lexically_relative(workspace.root());
  if (relative.empty() || *relative.begin() == "..") return absolute.string();
  return relative.string();
}

std::string locked_message(const Workspace& workspace, const fs::path& absolute) {
  std::error_code ec;
  fs::path target = fs::weakly_canonical(absolute, ec);
  if (ec) target = absolute;
  const std::string name = display_path(workspace, target);
  if (name == "model.py") {
    return "model.py is read-only: the task cannot be changed; write your solution in "
           "model_new.py";
  }
  if (name == "verify.sh" || name == "profile.sh") {
    return fmt::format("{} is read-only: it runs the locked check; run it with Bash "
                       "(./{}) instead of changing it", name, name);
  }
  if (name == "README.md") return "README.md is read-only: it describes the workspace";
  return fmt::format("{} is read-only: it is part of the task; write your solution in "
                     "model_new.py", name);
}

namespace {

std::string read_bytes(std::ifstream& in, uint64_t offset, uint64_t count) {
  std::string buffer(count, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(buffer.data(), static_cast<std::streamsize>(count));
  buffer.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  in.clear();
  return buffer;
}

}  // namespace

std::string read_range(const fs::path& path, uint64_t offset, uint64_t end, size_t max_chars) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  CA_CHECK(!ec, "cannot read '{}': {}", path.string(), ec.message());
  if (end == 0 || end > size) end = size;
  if (offset >= end) return "";
  std::ifstream in(path, std::ios::binary);
  CA_CHECK(in.good(), "cannot open '{}'", path.string());
  const uint64_t length = end - offset;
  if (length <= max_chars) return read_bytes(in, offset, length);
  // Read only what is shown: a runaway command can leave gigabytes behind.
  const size_t half = max_chars > 200 ? (max_chars - 100) / 2 : max_chars / 2;
  std::string head = read_bytes(in, offset, half);
  std::string tail = read_bytes(in, end - half, half);
  head.resize(complete_prefix(head));
  size_t skip = 0;
  while (skip < tail.size() && skip < 3 && (static_cast<unsigned char>(tail[skip]) & 0xC0) == 0x80) {
    ++skip;
  }
  tail.erase(0, skip);
  return fmt::format("{}\n[... {} characters truncated ...]\n{}", head,
                     length - head.size() - tail.size(), tail);
}

namespace {

// Whether `argv` runs and exits 0 within 10 s (a confinement that works on this machine).
bool runs_here(std::vector<std::string> argv) {
  SubprocessOptions probe;
  probe.argv = std::move(argv);
  probe.timeout_s = 10;
  try {
    const SubprocessResult r = run_subprocess(probe);
    return !r.timed_out && r.exit_code == 0;
  } catch (const std::exception&) {
    return false;  // not installed
  }
}

// confined-exec's options for ToolOptions' tmpfs, file-size, memory, GPU-memory and disk limits;
// `watched`: the episode's folders on disk.
void add_resource_limits(const ToolOptions& options, const std::vector<std::string>& watched,
                         std::vector<std::string>& argv) {
  if (options.tmpfs_bytes > 0) argv.insert(argv.end(), {"--tmpfs-bytes", std::to_string(options.tmpfs_bytes)});
  if (options.max_file_bytes > 0) argv.insert(argv.end(), {"--max-file-bytes", std::to_string(options.max_file_bytes)});
  if (options.max_memory_bytes > 0)
    argv.insert(argv.end(), {"--max-memory-bytes", std::to_string(options.max_memory_bytes)});
  if (options.max_gpu_memory_bytes > 0) {
    argv.insert(argv.end(), {"--max-gpu-memory-bytes", std::to_string(options.max_gpu_memory_bytes)});
    if (!options.gpu_lock_file.empty()) argv.insert(argv.end(), {"--gpu-lock", options.gpu_lock_file});
  }
  if (options.max_disk_bytes == 0) return;
  argv.insert(argv.end(), {"--max-disk-bytes", std::to_string(options.max_disk_bytes)});
  for (const std::string& path : watched) argv.insert(argv.end(), {"--watch", path});
}

// Whether `argv` works here, remembered once it did: a probe that failed (a machine busy past the
// 10 s for a moment) is tried again at the next command rather than leaving every later command of
// the process unconfined under `auto`; one that worked is not asked again, so a later failure of
// the confinement fails the command instead.
bool usable_here(std::atomic<bool>& known, std::vector<std::string> argv) {
  if (known.load()) return true;
  if (!runs_here(std::move(argv))) return false;
  known.store(true);
  return true;
}

// Whether `cuda-agent confined-exec` (the binary's own namespaces, no installs) works here.
bool namespaces_usable() {
  static std::atomic<bool> known{false};
  return usable_here(known, {self_executable(), "confined-exec", "true"});
}

}  // namespace

uint64_t default_command_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t quarter = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4 : 0;
  return std::clamp<uint64_t>(quarter, 8ULL << 30, 64ULL << 30);
}

bool bwrap_usable() {
  static std::atomic<bool> known{false};
  return usable_here(known, {"bwrap", "--ro-bind", "/", "/", "--unshare-net", "--die-with-parent", "true"});
}

std::vector<std::string> shell_argv(const ToolContext& context, const std::string& command) {
  const std::string& mode = context.options.confine;
  CA_CHECK(mode == "auto" || mode == "bwrap" || mode == "namespaces" || mode == "off",
           "tool option confine '{}' is unknown: use auto, bwrap, namespaces or off", mode);
  const bool bwrap = mode == "bwrap" || (mode == "auto" && bwrap_usable());
  const bool namespaces = !bwrap && (mode == "namespaces" || (mode == "auto" && namespaces_usable()));
  if (!bwrap && !namespaces) {
    if (mode == "auto") {
      // Said once, loudly: unconfined, a policy's commands read whatever the user can, the
      // answers the confinement hides among it.
      static std::once_flag said;
      std::call_once(said, [] {
        CA_LOG_WARN("agent", "Bash commands run unconfined (tool option confine: auto): neither bubblewrap nor `{} "
                             "confined-exec` ran here (each probe given 10 s, and tried again at each command until "
                             "one runs); set confine to bwrap or namespaces to make that an error instead",
                    self_executable());
      });
    }
    return {"bash", "-c", command};
  }
  if (bwrap)
    CA_CHECK(bwrap_usable(), "Bash is configured to run confined (confine: bwrap) but bubblewrap cannot run here: "
                             "install the bubblewrap package, or set confine to auto, namespaces or off");
  else
    CA_CHECK(namespaces_usable(), "Bash is configured to run confined (confine: namespaces) but `{} confined-exec` "
                                  "cannot create user namespaces here: set confine to auto, bwrap or off",
             self_executable());
  const std::string root = context.workspace->root().string();
  auto env = context.shell_env.find("CUDA_AGENT_CACHE_DIR");
  const std::string cache = env != context.shell_env.end() && !env->second.empty()
                                ? env->second
                                : sandbox::SandboxOptions{}.resolved_cache_dir();
  std::error_code ec;
  if (namespaces) {
    // The same file tree as under bubblewrap, from the binary's own confinement.
    std::vector<std::string> argv = {self_executable(), "confined-exec", "--writable", root};
    std::filesystem::create_directories(cache, ec);
    add_resource_limits(context.options, ec ? std::vector<std::string>{root} : std::vector<std::string>{root, cache}, argv);
    if (!ec) argv.insert(argv.end(), {"--writable", cache});
    for (const auto& path : context.options.writable_paths)
      if (std::filesystem::exists(path, ec)) argv.insert(argv.end(), {"--writable", path});
    for (const auto& locked : context.workspace->locked_files())
      if (std::filesystem::exists(locked, ec)) argv.insert(argv.end(), {"--read-only", locked.string()});
    for (const auto& path : context.options.hidden_paths)
      if (std::filesystem::is_directory(path, ec)) argv.insert(argv.end(), {"--hidden", path});
    for (const auto& path : context.options.read_only_paths)
      if (std::filesystem::exists(path, ec)) argv.insert(argv.end(), {"--read-only", path});
    for (const auto& path : context.options.visible_paths) argv.insert(argv.end(), {"--visible", path});
    argv.insert(argv.end(), {"bash", "-c", command});
    return argv;
  }
  // Order matters: a private /tmp first, then what the host's /tmp holds, read-only (the binary,
  // its Python or the workspace may live there), then the writable workspace and cache on top.
  // The host's /dev/shm is not the command's: a private one, of the same size as /tmp.
  std::vector<std::string> argv = {"bwrap", "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"};
  for (const char* dir : {"/tmp", "/dev/shm"}) {
    if (context.options.tmpfs_bytes > 0) argv.insert(argv.end(), {"--size", std::to_string(context.options.tmpfs_bytes)});
    argv.insert(argv.end(), {"--tmpfs", dir});
  }
  // The read scope (when there is one): what the command may read, resolved. The host's /tmp
  // entries come back only where it shows them; everything else outside it is shown empty, as
  // the binary's own confinement does it.
  std::vector<std::string> scope;
  if (!context.options.visible_paths.empty()) {
    std::filesystem::create_directories(cache, ec);
    std::vector<std::string> keep = context.options.visible_paths;
    keep.insert(keep.end(), {root, cache});
    for (const auto* list : {&context.options.writable_paths, &context.options.read_only_paths})
      keep.insert(keep.end(), list->begin(), list->end());
    for (const auto& locked : context.workspace->locked_files()) keep.push_back(locked.string());
    scope = resolve_read_scope(keep);
  }
  // Under a read scope only the scope's own paths come back from the host's /tmp, not the
  // folders on the way to them: what else those hold (other processes' folders, which come and
  // go) is simply not there, with nothing to cover. (A covered folder that vanished before
  // bubblewrap mounted over it failed the command: bubblewrap cannot make the mount point in a
  // read-only folder.)
  const auto in_tmp = [](const std::string& path) { return path_under(path, "/tmp"); };
  const auto in_scope = [&](const std::string& path) {
    return std::any_of(scope.begin(), scope.end(), [&](const std::string& k) { return path_under(path, k); });
  };
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    std::error_code type_ec;
    const std::string path = entry.path().string();
    if (!scope.empty() && !in_scope(path)) continue;  // outside the scope, or only on the way to a path of it
    if (entry.is_directory(type_ec) || entry.is_regular_file(type_ec))
      argv.insert(argv.end(), {"--ro-bind-try", path, path});  // may vanish meanwhile
  }
  // The scope's paths inside a /tmp entry that is only on the way to them, each bound alone (one
  // inside another scope path is shown with it).
  for (const auto& k : scope) {
    const std::string parent = std::filesystem::path(k).parent_path().string();
    if (in_tmp(parent) && parent != "/tmp" && !in_scope(parent)) argv.insert(argv.end(), {"--ro-bind-try", k, k});
  }
  // Hidden folders before what is shown inside them (the workspace inside its hidden run folder),
  // read-only once those are bound; one inside a path bound since is hidden again on top.
  std::vector<std::string> hidden;
  for (const auto& path : context.options.hidden_paths) {
    if (!std::filesystem::is_directory(path, ec)) continue;
    const std::string resolved = std::filesystem::canonical(path, ec).string();
    if (!ec) hidden.push_back(resolved);
  }
  if (!scope.empty()) {
    // What lies outside the scope is shown empty; not under /tmp (above), nor inside a hidden
    // folder (shown empty whole just after).
    const ReadScopeCover outside = read_scope_cover(scope, {"/tmp"});
    const auto skip = [&](const std::string& path) {
      return in_tmp(path) ||
             std::any_of(hidden.begin(), hidden.end(), [&](const std::string& h) { return path_under(path, h); });
    };
    for (const auto& dir : outside.dirs)
      if (!skip(dir)) argv.insert(argv.end(), {"--tmpfs", dir, "--remount-ro", dir});
    for (const auto& file : outside.files)
      if (!skip(file)) argv.insert(argv.end(), {"--ro-bind", "/dev/null", file});
  }
  for (const auto& path : hidden) argv.insert(argv.end(), {"--tmpfs", path});
  std::vector<std::string> shown = {root};
  argv.insert(argv.end(), {"--bind", root, root});
  ec.clear();
  std::filesystem::create_directories(cache, ec);
  std::vector<std::string> watched = {root};  // the episode's folders on disk
  if (!ec) argv.insert(argv.end(), {"--bind", cache, cache}), shown.push_back(cache), watched.push_back(cache);
  for (const auto& path : context.options.writable_paths)
    if (std::filesystem::exists(path, ec)) argv.insert(argv.end(), {"--bind", path, path}), shown.push_back(path);
  for (const auto& locked : context.workspace->locked_files())
    if (std::filesystem::exists(locked, ec)) argv.insert(argv.end(), {"--ro-bind", locked.string(), locked.string()});
  for (const auto& path : context.options.read_only_paths)
    if (std::filesystem::exists(path, ec)) argv.insert(argv.end(), {"--ro-bind", path, path}), shown.push_back(path);
  for (const auto& path : hidden) {
    const bool covered = std::any_of(shown.begin(), shown.end(), [&](const std::string& s) { return sandbox::path_within(path, s); });
    if (covered) argv.insert(argv.end(), {"--tmpfs", path});
    argv.insert(argv.end(), {"--remount-ro", path});
  }
  for (const auto& [name, value] : private_cache_env()) {
    argv.insert(argv.end(), {"--setenv", name, value});
    if (name == "TMPDIR") argv.insert(argv.end(), {"--dir", value});  // in the private /tmp
  }
  // The command itself through `confined-exec --signals-only`: it cannot signal (kill) anything
  // outside what it starts, other episodes' evaluations included (bubblewrap's own answer, a PID
  // namespace, has not been tried with the GPU's evaluations inside it).
  argv.insert(argv.end(), {"--unshare-net", "--die-with-parent", "--chdir", root, self_executable(), "confined-exec",
                           "--signals-only"});
  add_resource_limits(context.options, watched, argv);
  argv.insert(argv.end(), {"bash", "-c", command});
  return argv;
}

}  // namespace cuda_agent::agent

// The KernelBench repository layout (KernelBench/level1/19_ReLU.py, ...) and the dispatch
// between the three kinds of split (see split.h).
#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "task_ids.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

constexpr const char* kAcceptedForms =
    "a folder with split.yaml (or the split.yaml itself), a KernelBench folder with level1/, level2/, ... "
    "subfolders of N_Name.py files, or a .jsonl / .json / .parquet file of rows with a 'code' column";

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "level3" -> 3; anything else (including "level0", "level_3", "level3a") -> nullopt.
std::optional<int> level_of_folder(const std::string& name) {
  if (name.rfind("level", 0) != 0) return std::nullopt;
  const std::string_view digits = std::string_view(name).substr(5);
  int level = 0;
  if (!all_digits(digits)) return std::nullopt;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), level);
  if (ec != std::errc() || end != digits.data() + digits.size() || level < 1) return std::nullopt;
  return level;
}

// The levelN/ folders under `root`, sorted by level (then by name, for level1 vs level01).
std::vector<std::pair<int, fs::path>> level_folders(const fs::path& root) {
  std::vector<std::pair<int, fs::path>> out;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    if (auto level = level_of_folder(entry.path().filename().string())) out.emplace_back(*level, entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct KernelBenchFile {
  int level;
  unsigned long long number;
  std::string digits;  // the number as written ("019" stays "019" in the id)
  std::string name;    // after the first '_', before ".py"
  fs::path path;
};

// "19_ReLU.py" -> {19, "19", "ReLU"}; nullopt for any other name.
std::optional<KernelBenchFile> parse_task_file(int level, const fs::path& path) {
  const std::string file = path.filename().string();
  if (file.size() <= 3 || file.compare(file.size() - 3, 3, ".py") != 0) return std::nullopt;
  const std::string stem = file.substr(0, file.size() - 3);
  const size_t underscore = stem.find('_');
  if (underscore == std::string::npos || underscore + 1 >= stem.size()) return std::nullopt;
  KernelBenchFile f{level, 0, stem.substr(0, underscore), stem.substr(underscore + 1), path};
  if (!all_digits(f.digits)) return std::nullopt;
  auto [end, ec] = std::from_chars(f.digits.data(), f.digits.data() + f.digits.size(), f.number);
  if (ec != std::errc()) return std::nullopt;
  return f;
}

bool quietly_skipped(const std::string& name) { return name.empty() || name[0] == '.' || name == "__pycache__"; }

bool is_rows_file(const fs::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".parquet";
}

}  // namespace

Split load_kernelbench_dir(const fs::path& root) {
  CA_CHECK(fs::is_directory(root), "no KernelBench folder at {}: expected a folder with level1/, level2/, ... "
           "holding task files such as level1/19_ReLU.py", root.string());
  const fs::path abs_root = fs::weakly_canonical(fs::absolute(root));
  const auto levels = level_folders(abs_root);
  CA_CHECK(!levels.empty(), "{}: no levelN/ folder (level1/, level2/, ...): not a KernelBench layout; point at the "
           "folder that holds level1/ (in the KernelBench repository: KernelBench/)", abs_root.string());

  std::vector<KernelBenchFile> files;
  for (const auto& [level, folder] : levels) {
    std::vector<fs::path> entries;
    for (const fs::directory_entry& entry : fs::directory_iterator(folder)) entries.push_back(entry.path());
    std::sort(entries.begin(), entries.end());  // warnings in a stable order
    for (const fs::path& p : entries) {
      const std::string name = p.filename().string();
      if (quietly_skipped(name)) continue;
      std::optional<KernelBenchFile> f;
      if (fs::is_regular_file(p)) f = parse_task_file(level, p);
      if (!f) {
        CA_LOG_WARN("bench", "{}: skipped: not a KernelBench task file (expected <number>_<Name>.py, e.g. 19_ReLU.py)",
                    p.string());
        continue;
      }
      files.push_back(std::move(*f));
    }
  }
  CA_CHECK(!files.empty(), "{}: no task files: the levelN/ folders hold no <number>_<Name>.py files (e.g. "
           "level1/19_ReLU.py)", abs_root.string());
  std::sort(files.begin(), files.end(), [](const KernelBenchFile& a, const KernelBenchFile& b) {
    return std::tie(a.level, a.number, a.path) < std::tie(b.level, b.number, b.path);
  });

  Split split;
  split.name = abs_root.filename().string();
  split.description = fmt::format("KernelBench layout at {}", abs_root.string());
  split.root = abs_root;
  detail::UniqueIds ids;
  for (const KernelBenchFile& f : files) {
    TaskEntry e;
    const std::string raw = fmt::format("L{}_{}_{}", f.level, f.digits, f.name);
    e.id = ids.claim(detail::safe_task_id(raw, raw));
    e.path = f.path;
    e.level = f.level;
    e.source = "kernelbench";
    try {
      e.sha256 = sha256_hex(read_file(f.path));
    } catch (const Error& err) {
      CA_FAIL("{}: cannot read the task file: {}", abs_root.string(), err.what());
    }
    e.extra = {{"file", fs::relative(f.path, abs_root).generic_string()},
               {"problem_id", f.number},
               {"name", f.name}};
    split.tasks.push_back(std::move(e));
  }
  return split;
}

Split load_any_split(const fs::path& path, const fs::path& import_dir) {
  CA_CHECK(fs::exists(path), "no split at {}: the path does not exist; expected {}", path.string(), kAcceptedForms);
  if (fs::is_directory(path)) {
    if (fs::is_regular_file(path / "split.yaml")) return load_split(path);
    if (!level_folders(path).empty()) return load_kernelbench_dir(path);
    CA_FAIL("no split at {}: the folder has neither split.yaml nor levelN/ subfolders; expected {}", path.string(),
            kAcceptedForms);
  }
  const std::string ext = path.extension().string();
  if (fs::is_regular_file(path) && (ext == ".yaml" || ext == ".yml")) return load_split(path);
  if (fs::is_regular_file(path) && is_rows_file(path)) {
    CA_CHECK(!import_dir.empty(), "{}: a rows file is imported into a split folder first; give the folder to "
             "import into", path.string());
    return import_ops_rows(path, import_dir);
  }
  CA_FAIL("no split at {}: unrecognised file (extension '{}'); expected {}", path.string(), ext, kAcceptedForms);
}

}  // namespace cuda_agent::bench

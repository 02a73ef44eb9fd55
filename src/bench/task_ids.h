// Private to src/bench: task ids that are safe as file names and unique within a split.
// Header-only: used by kernelbench_loader.cpp and ops_import.cpp.
//
// Ownership: UniqueIds owns the set of ids handed out. Failure: never throws except
// std::bad_alloc. Thread safety: safe_task_id is pure; one UniqueIds per thread.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace cuda_agent::bench::detail {

inline constexpr size_t kMaxTaskIdLength = 100;

// Keeps [A-Za-z0-9_.-], replaces anything else (spaces, '/', non-ASCII bytes) by '_', cuts the
// result to kMaxTaskIdLength, and never returns "", "." or ".." or a name starting with '.'
// (hidden, or a path component with a meaning): a leading '.' becomes '_'. An empty input gives
// `fallback` (which the caller makes safe).
inline std::string safe_task_id(std::string_view raw, const std::string& fallback) {
  std::string id;
  for (char c : raw) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || c == '.';
    id += keep ? c : '_';
    if (id.size() == kMaxTaskIdLength) break;
  }
  if (id.empty()) return fallback;
  if (id[0] == '.') id[0] = '_';
  return id;
}

// Hands out ids, appending _2, _3, ... to one already taken. Deterministic for a given order of
// calls, so that loading or importing the same input twice gives the same ids.
class UniqueIds {
 public:
  std::string claim(const std::string& id) {
    std::string candidate = id;
    for (int n = 2; !taken_.insert(candidate).second; ++n) candidate = fmt::format("{}_{}", id, n);
    return candidate;
  }

 private:
  std::set<std::string> taken_;
};

}  // namespace cuda_agent::bench::detail

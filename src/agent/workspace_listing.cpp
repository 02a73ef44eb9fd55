// The confined file listing behind Glob and Grep, and glob matching.
#include <fnmatch.h>

#include <algorithm>
#include <system_error>

#include "tool_support.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxBraceExpansions = 256;

// Index of the '}' that closes the '{' at `open`, or npos.
size_t closing_brace(std::string_view pattern, size_t open) {
  int depth = 0;
  for (size_t i = open; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      ++i;
    } else if (pattern[i] == '{') {
      ++depth;
    } else if (pattern[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

// "a{b,c{d,e}}f" -> "abf", "acdf", "acef". A brace without a matching close or without a
// top-level comma stays literal.
void expand_braces(std::string_view pattern, std::vector<std::string>& out) {
  if (out.size() >= kMaxBraceExpansions) return;
  for (size_t open = 0; open < pattern.size(); ++open) {
    if (pattern[open] == '\\') {
      ++open;
      continue;
    }
    if (pattern[open] != '{') continue;
    const size_t close = closing_brace(pattern, open);
    if (close == std::string_view::npos) break;
    std::vector<std::string_view> alternatives;
    int depth = 0;
    size_t start = open + 1;
    for (size_t i = open + 1; i < close; ++i) {
      if (pattern[i] == '\\') {
        ++i;
      } else if (pattern[i] == '{') {
        ++depth;
      } else if (pattern[i] == '}') {
        --depth;
      } else if (pattern[i] == ',' && depth == 0) {
        alternatives.push_back(pattern.substr(start, i - start));
        start = i + 1;
      }
    }
    if (alternatives.empty()) continue;  // "{x}" is literal
    alternatives.push_back(pattern.substr(start, close - start));
    for (const auto& alternative : alternatives) {
      std::string expanded(pattern.substr(0, open));
      expanded.append(alternative);
      expanded.append(pattern.substr(close + 1));
      expand_braces(expanded, out);
    }
    return;
  }
  out.emplace_back(pattern);
}

std::vector<std::string> split_segments(std::string_view path) {
  std::vector<std::string> segments;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view segment = path.substr(start, end - start);
    if (!segment.empty() && segment != ".") segments.emplace_back(segment);
    start = end + 1;
  }
  return segments;
}

// Segment-wise match with '**' spanning any number of segments; memoized on (i, j) so that
// patterns with several '**' stay polynomial.
class SegmentMatcher {
 public:
  SegmentMatcher(const std::vector<std::string>& pattern, const std::vector<std::string>& path)
      : pattern_(pattern), path_(path),
        memo_((pattern.size() + 1) * (path.size() + 1), -1) {}

  bool match(size_t i, size_t j) {
    int8_t& cached = memo_[i * (path_.size() + 1) + j];
    if (cached >= 0) return cached == 1;
    bool result = false;
    if (i == pattern_.size()) {
      result = j == path_.size();
    } else if (pattern_[i] == "**") {
      for (size_t k = j; k <= path_.size() && !result; ++k) result = match(i + 1, k);
    } else {
      result = j < path_.size() && ::fnmatch(pattern_[i].c_str(), path_[j].c_str(), 0) == 0 &&
               match(i + 1, j + 1);
    }
    cached = result ? 1 : 0;
    return result;
  }

 private:
  const std::vector<std::string>& pattern_;
  const std::vector<std::string>& path_;
  std::vector<int8_t> memo_;
};

}  // namespace

bool glob_match(std::string_view pattern, std::string_view path) {
  std::vector<std::string> patterns;
  expand_braces(pattern, patterns);
  const std::vector<std::string> path_segments = split_segments(path);
  for (const auto& expanded : patterns) {
    const std::vector<std::string> pattern_segments = split_segments(expanded);
    if (SegmentMatcher(pattern_segments, path_segments).match(0, 0)) return true;
  }
  return false;
}

std::vector<ListedFile> list_files(const Workspace& workspace, const fs::path& base,
                                   size_t max_entries, bool* capped) {
  std::vector<ListedFile> files;
  *capped = false;
  std::error_code ec;
  fs::recursive_directory_iterator it(base, fs::directory_options::skip_permission_denied, ec);
  size_t seen = 0;
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (++seen > max_entries) {
      *capped = true;
      break;
    }
    const fs::directory_entry& entry = *it;
    const fs::path& path = entry.path();
    std::error_code entry_ec;
    fs::file_time_type mtime;
    if (entry.is_symlink(entry_ec)) {
      // The iterator does not descend into symlinked directories; a symlinked file is listed
      // only when it resolves inside the workspace, so Grep never reads outside through it.
      fs::path target;
      try {
        target = workspace.resolve(path.string());
      } catch (const std::exception&) {
        continue;
      }
      if (!fs::is_regular_file(target, entry_ec)) continue;
      mtime = fs::last_write_time(target, entry_ec);
    } else if (entry.is_regular_file(entry_ec)) {
      mtime = entry.last_write_time(entry_ec);
    } else {
      continue;
    }
    files.push_back({path, display_path(workspace, path),
                     path.lexically_relative(base).generic_string(), mtime});
  }
  return files;
}

void sort_newest_first(std::vector<ListedFile>& files) {
  std::sort(files.begin(), files.end(), [](const ListedFile& a, const ListedFile& b) {
    if (a.mtime != b.mtime) return a.mtime > b.mtime;
    return a.relative < b.relative;
  });
}

}  // namespace cuda_agent::agent

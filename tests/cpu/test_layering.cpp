// The components' layering (../shared/DESIGN.md, "Folders under src/"), checked on the include
// graph: a file of component C (src/C/..., include/cuda_agent/C/...) may include the headers of
// C and of what C uses, directly or through another component, and nothing else.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fs = std::filesystem;

namespace {

// What each component may use, written once (DESIGN.md). app and tools sit on top of everything.
const std::map<std::string, std::set<std::string>>& kUses() {
  static const std::map<std::string, std::set<std::string>> uses = {
      {"core", {}},
      {"sandbox", {"core"}},
      {"bench", {"sandbox"}},
      {"agent", {"sandbox", "bench"}},
      {"policy", {"core"}},
      {"lm", {"policy"}},
      {"serve", {"policy", "lm", "agent"}},
      {"rl", {"agent", "serve", "lm", "policy"}},
      {"data", {"sandbox", "bench"}},
      {"export", {"sandbox"}},
  };
  return uses;
}

// Known debt, each to go (none today: keep it so).
// An entry that no longer breaks the layering fails the test, so that the list only shrinks.
const std::set<std::string> kKnownExceptions = {};

std::set<std::string> allowed(const std::string& component) {
  std::set<std::string> out = {component};
  std::vector<std::string> todo = {component};
  while (!todo.empty()) {
    const std::string c = todo.back();
    todo.pop_back();
    for (const std::string& u : kUses().at(c))
      if (out.insert(u).second) todo.push_back(u);
  }
  return out;
}

}  // namespace

TEST(Layering, IncludesFollowTheComponentOrder) {
  const fs::path root = CUDA_AGENT_SOURCE_DIR;
  const std::regex include(R"re(#include\s+"cuda_agent/([a-z_]+)/)re");
  std::set<std::string> found;
  size_t files = 0;
  for (const fs::path& base : {root / "src", root / "include/cuda_agent"}) {
    for (const auto& e : fs::recursive_directory_iterator(base)) {
      if (!e.is_regular_file()) continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".h" && ext != ".cpp" && ext != ".cuh" && ext != ".cu") continue;
      const fs::path rel = fs::relative(e.path(), base);
      if (rel.begin() == rel.end() || std::next(rel.begin()) == rel.end()) continue;  // not in a component folder
      const std::string component = rel.begin()->string();
      if (!kUses().count(component)) continue;  // app, tools: on top of everything
      ++files;
      const std::set<std::string> ok = allowed(component);
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string s = text.str();
      for (std::sregex_iterator m(s.begin(), s.end(), include), end; m != end; ++m) {
        const std::string used = (*m)[1];
        if (ok.count(used)) continue;
        found.insert(fs::relative(e.path(), root).string() + " -> " + used);
      }
    }
  }
  EXPECT_GT(files, 100u);
  for (const std::string& v : found)
    EXPECT_TRUE(kKnownExceptions.count(v)) << v << ": an include against the layering of DESIGN.md ("
                                           << "a component may use only what DESIGN.md says it uses)";
  for (const std::string& k : kKnownExceptions)
    EXPECT_TRUE(found.count(k)) << k << " no longer breaks the layering: remove it from kKnownExceptions";
}

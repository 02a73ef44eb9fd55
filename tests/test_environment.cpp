// Linked into every test executable: the programs the code under test starts by its own path
// (self_executable(): the judge, `confined-exec` for the agent's Bash) are cuda-agent's, not the
// test binary's, unless the environment already names one.
#include <cstdlib>

namespace {

const bool kBinarySet = [] { return ::setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, /*overwrite=*/0) == 0; }();

}  // namespace

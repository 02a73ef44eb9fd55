// The embedded CPython interpreter that runs task and solution modules.
//
// One interpreter per process, started by start_python() and kept until exit (torch does not
// survive a finalize/re-initialize cycle). The interpreter is configured as the Python the
// binary was built against (CUDA_AGENT_PYTHON at configure time, or $CUDA_AGENT_PYTHON at run
// time), so a virtual environment's site-packages (torch) are found.
//
// Not thread-safe: call from the main thread; the GIL is held by that thread afterwards.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_agent/core/subprocess.h"

namespace cuda_agent::sandbox {

// Starts the interpreter if it is not running. Throws Error when it cannot start or when
// `import torch` fails (the message says which Python was used and how to choose another).
void start_python();

// True once start_python() succeeded.
bool python_started();

// The interpreter executable the embedded Python pretends to be.
std::string python_executable();

// fork_subprocess with the interpreter's fork protocol around it (what os.fork does: its locks
// taken before, its state and os.register_at_fork's callbacks after, in both processes), so that
// the child goes on with this interpreter and everything it imported. Call from the thread that
// holds the GIL, before anything has initialised CUDA (a CUDA context does not survive a fork).
pid_t fork_with_python(const SubprocessOptions& options, const std::function<int()>& body);

// Sets environment variables in the process and, once the interpreter runs, in its os.environ
// (read once when it started), and forgets tempfile's cached folder, so that Python code and
// native code see the same values. TMPDIR's folder is created.
void set_process_environment(const std::vector<std::pair<std::string, std::string>>& env);

// Automatic garbage collection off for a stretch of the harness's own work, and back as it was
// after: a collection there would run the solution's gc.callbacks (and its garbage's finalizers)
// inside the harness's launch scope, where what they launch or copy counts as the harness's, or
// between the judge's staging of a run's inputs and the timer's start. Hold the GIL.
class GcPause {
 public:
  GcPause();
  ~GcPause();
  GcPause(const GcPause&) = delete;
  GcPause& operator=(const GcPause&) = delete;

 private:
  bool was_enabled_;
};

}  // namespace cuda_agent::sandbox

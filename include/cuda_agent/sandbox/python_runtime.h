// The embedded CPython interpreter that runs task and solution modules.
//
// One interpreter per process, started by start_python() and kept until exit (torch does not
// survive a finalize/re-initialize cycle). The interpreter is configured as the Python the
// binary was built against (CUDA_AGENT_PYTHON at configure time, or $CUDA_AGENT_PYTHON at run
// time), so a virtual environment's site-packages (torch) are found.
//
// Not thread-safe: call from the main thread; the GIL is held by that thread afterwards.
#pragma once

#include <string>

namespace cuda_agent::sandbox {

// Starts the interpreter if it is not running. Throws Error when it cannot start or when
// `import torch` fails (the message says which Python was used and how to choose another).
void start_python();

// True once start_python() succeeded.
bool python_started();

// The interpreter executable the embedded Python pretends to be.
std::string python_executable();

}  // namespace cuda_agent::sandbox

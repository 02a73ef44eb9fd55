# Finds every dependency with find_package and stops with a message naming what to install.

find_package(Threads REQUIRED)

macro(ca_require pkg hint)
  find_package(${pkg} ${ARGN} QUIET)
  if(NOT ${pkg}_FOUND)
    message(FATAL_ERROR "cuda-agent needs ${pkg}: ${hint}")
  endif()
endmacro()

ca_require(fmt "install libfmt-dev (Debian) or run scripts/setup.sh")
ca_require(spdlog "install libspdlog-dev (Debian) or run scripts/setup.sh")
ca_require(nlohmann_json "install nlohmann-json3-dev (Debian) or run scripts/setup.sh")
ca_require(yaml-cpp "install libyaml-cpp-dev (Debian) or run scripts/setup.sh")
ca_require(CLI11 "install libcli11-dev (Debian) or run scripts/setup.sh")
if(CUDA_AGENT_BUILD_TESTS)
  ca_require(GTest "install libgtest-dev and libgmock-dev (Debian) or run scripts/setup.sh")
endif()

# --- Python: the interpreter whose torch we use, and its libpython for embedding ------------
if(NOT CUDA_AGENT_PYTHON)
  find_program(CUDA_AGENT_PYTHON NAMES python3 REQUIRED)
endif()
execute_process(
  COMMAND "${CUDA_AGENT_PYTHON}" -c "import sys, torch, pybind11; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(pybind11.get_cmake_dir()); print(sys.executable); import os; print(os.path.dirname(torch.__file__))"
  OUTPUT_VARIABLE _ca_py_out RESULT_VARIABLE _ca_py_rc ERROR_VARIABLE _ca_py_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _ca_py_rc EQUAL 0)
  message(FATAL_ERROR "cuda-agent needs a Python with torch 2.11.x and pybind11; "
    "'${CUDA_AGENT_PYTHON}' failed to import them:\n${_ca_py_err}\n"
    "Run scripts/setup.sh (it creates .venv) or pass -DCUDA_AGENT_PYTHON=/path/to/python3.")
endif()
string(REPLACE "\n" ";" _ca_py_lines "${_ca_py_out}")
list(GET _ca_py_lines 0 CUDA_AGENT_TORCH_VERSION)
list(GET _ca_py_lines 1 _ca_torch_prefix)
list(GET _ca_py_lines 2 _ca_pybind11_dir)
list(GET _ca_py_lines 3 CUDA_AGENT_PYTHON_EXECUTABLE)
list(GET _ca_py_lines 4 _ca_torch_dir)
if(NOT CUDA_AGENT_TORCH_VERSION MATCHES "^2\\.11\\.")
  message(FATAL_ERROR "cuda-agent is pinned to torch 2.11.x (the GPU host's); "
    "'${CUDA_AGENT_PYTHON}' has torch ${CUDA_AGENT_TORCH_VERSION}. Run scripts/setup.sh.")
endif()
set(CUDA_AGENT_TORCH_LIB_DIR "${_ca_torch_dir}/lib")

set(Python3_EXECUTABLE "${CUDA_AGENT_PYTHON}")
find_package(Python3 COMPONENTS Interpreter Development.Embed)
if(NOT Python3_Development.Embed_FOUND)
  message(FATAL_ERROR "cuda-agent embeds CPython and needs its headers and libpython for "
    "${CUDA_AGENT_PYTHON}: install python3-dev (Debian).")
endif()
set(pybind11_DIR "${_ca_pybind11_dir}")
ca_require(pybind11 "pip install pybind11 into the Python given by CUDA_AGENT_PYTHON (scripts/setup.sh does)" CONFIG)

# --- libtorch, from the same wheel ----------------------------------------------------------
list(APPEND CMAKE_PREFIX_PATH "${_ca_torch_prefix}")
# Torch's CMake files probe the GPU unless told the architectures; we compile no CUDA sources
# ourselves (NVRTC does, at run time), so name Hopper and keep the probe off CPU machines.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
set(CMAKE_CUDA_STANDARD 17)
find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "cuda-agent needs libtorch from the torch wheel (prefix ${_ca_torch_prefix}); "
    "find_package(Torch) failed. Run scripts/setup.sh, and check that the CUDA Toolkit 13 is in /usr/local/cuda.")
endif()

# --- CUDA Toolkit 13: headers only; the libraries are loaded at run time --------------------
find_package(CUDAToolkit 13 QUIET)
if(NOT CUDAToolkit_FOUND)
  message(FATAL_ERROR "cuda-agent needs the CUDA Toolkit 13 (driver API, NVRTC, CUPTI, cuBLAS, "
    "cuDNN headers). Install it to /usr/local/cuda or set CUDAToolkit_ROOT.")
endif()
get_filename_component(CUDA_AGENT_CUDA_HOME "${CUDAToolkit_BIN_DIR}" DIRECTORY)
set(CUDA_AGENT_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
get_filename_component(_ca_site "${_ca_torch_dir}" DIRECTORY)
set(CUDA_AGENT_PYTHON_SITE "${_ca_site}")
foreach(header cuda.h nvrtc.h cupti.h cublas_v2.h cudnn.h)
  find_path(_ca_dir_${header} ${header}
    HINTS ${CUDAToolkit_INCLUDE_DIRS} "${CUDA_AGENT_CUDA_HOME}/extras/CUPTI/include"
          "${_ca_site}/nvidia/cu13/include" "${_ca_site}/nvidia/cudnn/include"
          "${_ca_site}/nvidia/cuda_cupti/include"
    NO_DEFAULT_PATH)
  if(NOT _ca_dir_${header})
    message(FATAL_ERROR "cuda-agent needs ${header} (CUDA Toolkit 13 or the matching nvidia-* wheel); "
      "looked in ${CUDAToolkit_INCLUDE_DIRS}, ${CUDA_AGENT_CUDA_HOME}/extras/CUPTI/include and ${_ca_site}/nvidia/*/include.")
  endif()
  list(APPEND CUDA_AGENT_CUDA_INCLUDE_DIRS "${_ca_dir_${header}}")
endforeach()
list(REMOVE_DUPLICATES CUDA_AGENT_CUDA_INCLUDE_DIRS)

# --- nvcc, for the language model's own kernels (src/lm/*.cu: the batch engine's paged decode
# attention). Without it the engine decodes through torch's attention instead. (Torch's CMake
# files usually enable CUDA already.)
if(CUDAToolkit_NVCC_EXECUTABLE AND NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
endif()
set(CUDA_AGENT_CUDA_ARCHITECTURES "80-real;90" CACHE STRING
    "GPU architectures of the language model's kernels (Ampere and Hopper machine code, Hopper PTX)")
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
else()
  message(STATUS "cuda-agent: no CUDA compiler: the batch engine decodes without its paged attention kernel")
endif()
message(STATUS "cuda-agent: python ${CUDA_AGENT_PYTHON_EXECUTABLE}, torch ${CUDA_AGENT_TORCH_VERSION}, CUDA ${CUDAToolkit_VERSION}")

# hetobs._torch_ext: the instrumented c10d backend behind "hetobs_gloo", "hetobs_nccl" and
# hetobs.torch.wrap(). Compiled against the torch installed in the build's Python (its
# headers, its bundled pybind11, its C++ ABI), so that torch dispatches ops to it with no
# Python on the way. Skipped, with a message, when that Python has no torch: the
# wrappers then run as a Python ProcessGroup (correct, ~20 us more per call).
# HETOBS_TORCH_EXT=OFF skips it on purpose; =ON makes a missing torch an error.
set(HETOBS_TORCH_EXT AUTO CACHE STRING "Build hetobs._torch_ext (AUTO: when torch is importable)")
if(HETOBS_TORCH_EXT STREQUAL "OFF")
  return()
endif()
execute_process(
  COMMAND ${Python_EXECUTABLE} -c
    "import torch, torch.utils.cpp_extension as c; print(torch.__version__); print(','.join(c.include_paths())); print(c.library_paths()[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  RESULT_VARIABLE HETOBS_TORCH_RC OUTPUT_VARIABLE HETOBS_TORCH_INFO ERROR_VARIABLE HETOBS_TORCH_ERR
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT HETOBS_TORCH_RC EQUAL 0)
  if(HETOBS_TORCH_EXT STREQUAL "ON")
    message(FATAL_ERROR "hetobs: HETOBS_TORCH_EXT=ON but ${Python_EXECUTABLE} cannot import torch: ${HETOBS_TORCH_ERR}")
  endif()
  message(STATUS "hetobs: torch not importable by ${Python_EXECUTABLE}: hetobs._torch_ext is not built")
  return()
endif()
string(REPLACE "\n" ";" HETOBS_TORCH_INFO "${HETOBS_TORCH_INFO}")
list(GET HETOBS_TORCH_INFO 0 HETOBS_TORCH_VERSION)
list(GET HETOBS_TORCH_INFO 1 HETOBS_TORCH_INCLUDES)
list(GET HETOBS_TORCH_INFO 2 HETOBS_TORCH_LIBDIR)
list(GET HETOBS_TORCH_INFO 3 HETOBS_TORCH_CXX11_ABI)
string(REPLACE "," ";" HETOBS_TORCH_INCLUDES "${HETOBS_TORCH_INCLUDES}")
# The c10d Backend virtuals it overrides are those of torch 2.13 (the version it is tested
# with); another torch may lack or rename one, and a compile error would fail the whole
# install. So AUTO builds it for 2.13.x only; ON tries any version.
if(NOT HETOBS_TORCH_EXT STREQUAL "ON" AND NOT HETOBS_TORCH_VERSION MATCHES "^2\\.13\\.")
  message(STATUS "hetobs: torch ${HETOBS_TORCH_VERSION} is not 2.13.x: hetobs._torch_ext is not built "
                 "(the torch wrappers run in Python; -DHETOBS_TORCH_EXT=ON tries anyway)")
  return()
endif()
message(STATUS "hetobs: building hetobs._torch_ext against torch ${HETOBS_TORCH_VERSION}")

# WITH_SOABI: named like every CPython extension, so a module built for another Python
# is never picked up.
Python_add_library(_torch_ext MODULE WITH_SOABI
  ${CMAKE_CURRENT_LIST_DIR}/module.cc
  ${CMAKE_CURRENT_LIST_DIR}/instrumented_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/instrumented_work.cc
  ${CMAKE_CURRENT_LIST_DIR}/completion_poller.cc)
# torch's include directory first: its bundled pybind11 must win over the pip one.
target_include_directories(_torch_ext BEFORE PRIVATE ${HETOBS_TORCH_INCLUDES})
target_include_directories(_torch_ext PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_features(_torch_ext PRIVATE cxx_std_20)
target_compile_definitions(_torch_ext PRIVATE
  HETOBS_TORCH_VERSION="${HETOBS_TORCH_VERSION}" _GLIBCXX_USE_CXX11_ABI=${HETOBS_TORCH_CXX11_ABI}
  TORCH_EXTENSION_NAME=_torch_ext)
target_compile_options(_torch_ext PRIVATE -Wall -Wextra -Wno-unused-parameter -O2)
find_library(HETOBS_LIBTORCH torch PATHS ${HETOBS_TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(HETOBS_LIBTORCH_CPU torch_cpu PATHS ${HETOBS_TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(HETOBS_LIBC10 c10 PATHS ${HETOBS_TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(HETOBS_LIBTORCH_PYTHON torch_python PATHS ${HETOBS_TORCH_LIBDIR} NO_DEFAULT_PATH REQUIRED)
target_link_libraries(_torch_ext PRIVATE
  ${HETOBS_LIBTORCH} ${HETOBS_LIBTORCH_CPU} ${HETOBS_LIBC10} ${HETOBS_LIBTORCH_PYTHON})
set_target_properties(_torch_ext PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  # torch's libraries sit next to this package in site-packages (and are already loaded
  # by `import torch`, which hetobs.torch does first).
  INSTALL_RPATH "$ORIGIN/../torch/lib")
install(TARGETS _torch_ext DESTINATION hetobs)

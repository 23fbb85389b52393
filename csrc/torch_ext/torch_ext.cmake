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
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/find_torch.cmake)
if(NOT HETOBS_TORCH_FOUND)
  if(HETOBS_TORCH_EXT STREQUAL "ON")
    message(FATAL_ERROR "hetobs: HETOBS_TORCH_EXT=ON but ${Python_EXECUTABLE} cannot import torch: ${HETOBS_TORCH_ERR}")
  endif()
  message(STATUS "hetobs: torch not importable by ${Python_EXECUTABLE}: hetobs._torch_ext is not built")
  return()
endif()
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
  ${CMAKE_CURRENT_LIST_DIR}/completion_poller.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_lane.cc)
hetobs_torch_target(_torch_ext)
target_include_directories(_torch_ext PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_definitions(_torch_ext PRIVATE HETOBS_TORCH_VERSION="${HETOBS_TORCH_VERSION}" TORCH_EXTENSION_NAME=_torch_ext)
install(TARGETS _torch_ext DESTINATION hetobs)

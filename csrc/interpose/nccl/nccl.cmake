# libhetobs_nccl.so: the NCCL LD_PRELOAD interposer and NCCL profiler plugin in one
# library (so both see the same state when NCCL_PROFILER_PLUGIN names it). Builds
# without NCCL or CUDA: nccl_api.h declares what it uses, the rest is found at run time.
set(HETOBS_NCCL_DIR ${CMAKE_CURRENT_LIST_DIR})
add_library(hetobs_nccl SHARED
  ${HETOBS_NCCL_DIR}/cuda_rt.cc
  ${HETOBS_NCCL_DIR}/interpose.cc
  ${HETOBS_NCCL_DIR}/nccl_comm.cc
  ${HETOBS_NCCL_DIR}/nccl_state.cc
  ${HETOBS_NCCL_DIR}/op_watch.cc
  ${HETOBS_NCCL_DIR}/profiler.cc)
target_link_libraries(hetobs_nccl PRIVATE hetobs_core ${CMAKE_DL_LIBS} Threads::Threads)
set_target_properties(hetobs_nccl PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS ${HETOBS_NCCL_DIR}/exports.map)
target_compile_options(hetobs_nccl PRIVATE -Wall -Wextra -O2)
if(HETOBS_WERROR)
  target_compile_options(hetobs_nccl PRIVATE -Werror)
endif()
target_link_options(hetobs_nccl PRIVATE
  -Wl,--version-script=${HETOBS_NCCL_DIR}/exports.map -Wl,--no-undefined -Wl,--exclude-libs,ALL)
install(TARGETS hetobs_nccl LIBRARY DESTINATION hetobs/lib)

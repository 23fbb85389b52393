# libhetobs_mpi.so: the PMPI interposer, loaded with LD_PRELOAD into MPI ranks.
# Built against whichever MPI the compiler wrapper (mpicc) belongs to; skipped, with a
# message, when no MPI is found (the rest of hetobs builds without it).
# FindMPI's C component needs the C language (the project itself is CXX only).
include(CheckLanguage)
check_language(C)
if(CMAKE_C_COMPILER)
  enable_language(C)
  find_package(MPI COMPONENTS C QUIET)
endif()
if(NOT MPI_C_FOUND)
  message(STATUS "hetobs: no MPI found (mpicc): libhetobs_mpi.so is not built")
  return()
endif()
message(STATUS "hetobs: building libhetobs_mpi.so against MPI ${MPI_C_VERSION} (${MPI_C_LIBRARIES})")

add_library(hetobs_mpi SHARED
  ${CMAKE_CURRENT_LIST_DIR}/state.cc
  ${CMAKE_CURRENT_LIST_DIR}/wrappers.cc)
target_link_libraries(hetobs_mpi PRIVATE hetobs_core MPI::MPI_C)
# mpi.h included from C++ must not drag in the deprecated MPI C++ bindings.
target_compile_definitions(hetobs_mpi PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
target_compile_options(hetobs_mpi PRIVATE -Wall -Wextra -O3)
if(HETOBS_WERROR)
  target_compile_options(hetobs_mpi PRIVATE -Werror)
endif()
# Only the MPI_* entry points are exported: the core stays private to this library, so
# it cannot clash with hetobs._core or anything else loaded into the process.
set_target_properties(hetobs_mpi PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  POSITION_INDEPENDENT_CODE ON
  OUTPUT_NAME hetobs_mpi)
target_link_options(hetobs_mpi PRIVATE -Wl,--exclude-libs,ALL -Wl,-z,defs
  -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/exports.map)
set_property(TARGET hetobs_mpi APPEND PROPERTY LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/exports.map)
install(TARGETS hetobs_mpi LIBRARY DESTINATION hetobs/lib)

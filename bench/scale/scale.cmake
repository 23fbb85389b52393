# hetobs_scale_rank: one native rank of the scale harness (bench/scale/run.py builds it with
# `cmake --build <build dir> --target hetobs_scale_rank`; not part of the default build).
add_executable(hetobs_scale_rank EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/scale_rank.cc)
target_link_libraries(hetobs_scale_rank PRIVATE hetobs_core)
target_compile_options(hetobs_scale_rank PRIVATE -Wall -Wextra -O2)

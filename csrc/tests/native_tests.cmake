# hetobs_native_tests: C++ tests of the core with no Python (HMAC known answers, recorder ring
# wrap, communicator close against dumps, handshakes proven before their answer and closed
# communicators said to redials, reconnect probes of a dying peer, shm single copy between
# processes, the doorbell's wake-ups, shm mail slots and push, a failed relay draining both copy
# directions, the TSC clock, the op-mismatch vote and the wait policy), meant to run under the sanitizers
# (scripts/sanitize.sh builds it with HETOBS_SANITIZE=thread and =address).
add_executable(hetobs_native_tests
  ${CMAKE_CURRENT_LIST_DIR}/main.cc
  ${CMAKE_CURRENT_LIST_DIR}/hmac_kat_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/recorder_wrap_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/close_vs_dump_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_frame_fuzz_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/handshake_pool_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/handshake_proven_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/reconnect_probe_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/single_copy_probe_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/doorbell_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/shm_mail_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/shm_push_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/relay_drain_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/clock_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/mismatch_vote_test.cc)
target_link_libraries(hetobs_native_tests PRIVATE hetobs_core)
target_compile_options(hetobs_native_tests PRIVATE -Wall -Wextra)

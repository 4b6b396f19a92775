# spans_run: what the writer writes in a later decision's batch runs next --
# natively (spans through /proc/self/mem), under valgrind's default
# --smc-check and under qemu-user with and without a guest base (there the
# writer's oracle must say no without crashing, and the window is used).
add_executable(spans_run spans_run.c)
target_compile_definitions(spans_run PRIVATE _GNU_SOURCE)
target_link_libraries(spans_run PRIVATE altpatch_internal)
add_test(NAME spans_run COMMAND spans_run)
set_tests_properties(spans_run PROPERTIES TIMEOUT 60
  PASS_REGULAR_EXPRESSION "spans_run: ok" FAIL_REGULAR_EXPRESSION "FAILED")
find_program(VALGRIND_EXECUTABLE valgrind)
if(VALGRIND_EXECUTABLE AND NOT ALTPATCH_SANITIZE)
  add_test(NAME valgrind_spans_run COMMAND ${VALGRIND_EXECUTABLE} --quiet --error-exitcode=1
    $<TARGET_FILE:spans_run>)
  set_tests_properties(valgrind_spans_run PROPERTIES TIMEOUT 120 LABELS valgrind
    PASS_REGULAR_EXPRESSION "spans_run: ok" FAIL_REGULAR_EXPRESSION "FAILED")
endif()
find_program(QEMU_X86_64_EXECUTABLE qemu-x86_64)
if(QEMU_X86_64_EXECUTABLE AND NOT ALTPATCH_SANITIZE)
  add_test(NAME qemu_spans_run COMMAND ${QEMU_X86_64_EXECUTABLE} $<TARGET_FILE:spans_run>)
  add_test(NAME qemu_spans_run_guest_base
    COMMAND ${QEMU_X86_64_EXECUTABLE} -B 0x10000 $<TARGET_FILE:spans_run>)
  set_tests_properties(qemu_spans_run qemu_spans_run_guest_base PROPERTIES TIMEOUT 120
    LABELS qemu PASS_REGULAR_EXPRESSION "spans_run: ok" FAIL_REGULAR_EXPRESSION "FAILED")
endif()

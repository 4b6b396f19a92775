# The library's own region before the C library's heap (altpatch/src/mem.c):
#   heap_first_apply        a small program's first apply makes no heap call
#                           (-Wl,--wrap counters); the region after fork and
#                           after altpatch_dlopen/dlclose cycles of libapfix_dl.so
#   valgrind_heap_first_apply  the same under valgrind
#   test_mem                the allocator's own cases (Criterion)
add_executable(heap_first_apply heap_first_apply.c)
target_compile_definitions(heap_first_apply PRIVATE _GNU_SOURCE
  APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
target_link_libraries(heap_first_apply PRIVATE altpatch_internal ${CMAKE_DL_LIBS}
  "-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=posix_memalign,--wrap=aligned_alloc")
add_dependencies(heap_first_apply apfix_dl)
add_test(NAME heap_first_apply COMMAND heap_first_apply)
set_tests_properties(heap_first_apply PROPERTIES TIMEOUT 120
  PASS_REGULAR_EXPRESSION "heap_first_apply: ok" FAIL_REGULAR_EXPRESSION "FAILED")
find_program(VALGRIND_EXECUTABLE valgrind)
if(VALGRIND_EXECUTABLE AND NOT ALTPATCH_SANITIZE)
  add_test(NAME valgrind_heap_first_apply COMMAND ${VALGRIND_EXECUTABLE} --quiet
    --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite
    $<TARGET_FILE:heap_first_apply>)
  set_tests_properties(valgrind_heap_first_apply PROPERTIES TIMEOUT 300 LABELS valgrind
    PASS_REGULAR_EXPRESSION "heap_first_apply: ok" FAIL_REGULAR_EXPRESSION "FAILED")
endif()
if(TARGET test_mem)
  target_link_libraries(test_mem PRIVATE pthread)
endif()

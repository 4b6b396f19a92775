# The library's own region before the C library's heap (altpatch/src/mem.c):
#   heap_first_apply        a small program's first apply makes no heap call
#                           (-Wl,--wrap counters); the region after fork and
#                           after altpatch_dlopen/dlclose cycles of libapfix_dl.so
#   valgrind_heap_first_apply  the same under valgrind (no region there: the
#                           cycles' heap and values)
#   test_mem                the allocator's own cases (Criterion)
#   heap_first_apply_1k     the same with 1,000 more sites, all written: its
#                           first apply's larger blocks (tens of KiB) too
foreach(hf heap_first_apply heap_first_apply_1k)
  add_executable(${hf} heap_first_apply.c)
  target_compile_definitions(${hf} PRIVATE _GNU_SOURCE
    APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
  target_link_libraries(${hf} PRIVATE altpatch_internal ${CMAKE_DL_LIBS}
    "-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=posix_memalign,--wrap=aligned_alloc")
  add_dependencies(${hf} apfix_dl)
  add_test(NAME ${hf} COMMAND ${hf})
  set_tests_properties(${hf} PROPERTIES TIMEOUT 120
    PASS_REGULAR_EXPRESSION "heap_first_apply: ok" FAIL_REGULAR_EXPRESSION "FAILED")
endforeach()
target_compile_definitions(heap_first_apply_1k PRIVATE HEAP_FIRST_MANY=1000)
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

# mem_memcheck: a block from the region, overrun by one byte, leaked or read
# after its free, reported by memcheck (mem.c tells it of the region's
# blocks where the build found valgrind's memcheck.h; the test needs it
# too). block() checks the block is the region's.
include(CheckIncludeFile)
check_include_file(valgrind/memcheck.h ALTPATCH_HAVE_MEMCHECK_H)
if(ALTPATCH_HAVE_MEMCHECK_H)
  add_executable(mem_memcheck mem_memcheck.c)
  target_link_libraries(mem_memcheck PRIVATE altpatch_internal)
  add_test(NAME mem_memcheck_place COMMAND mem_memcheck place)
  set_tests_properties(mem_memcheck_place PROPERTIES TIMEOUT 60
    PASS_REGULAR_EXPRESSION "mem_memcheck: place done" FAIL_REGULAR_EXPRESSION "FAILED")
  if(VALGRIND_EXECUTABLE AND NOT ALTPATCH_SANITIZE)
    set(mem_vg ${VALGRIND_EXECUTABLE} --error-exitcode=1 --leak-check=full
      --errors-for-leak-kinds=definite)
    add_test(NAME valgrind_mem_memcheck_overrun COMMAND ${mem_vg} $<TARGET_FILE:mem_memcheck> overrun)
    set_tests_properties(valgrind_mem_memcheck_overrun PROPERTIES TIMEOUT 120 LABELS valgrind
      PASS_REGULAR_EXPRESSION "Invalid write of size 1.*0 bytes after a block of size 100 alloc'd.*by [^\n]*ap_mem_alloc \\(.*by [^\n]*block \\([^)]*mem_memcheck.c:"
      FAIL_REGULAR_EXPRESSION "FAILED")
    add_test(NAME valgrind_mem_memcheck_leak COMMAND ${mem_vg} $<TARGET_FILE:mem_memcheck> leak)
    set_tests_properties(valgrind_mem_memcheck_leak PROPERTIES TIMEOUT 120 LABELS valgrind
      PASS_REGULAR_EXPRESSION "100 bytes in 1 blocks are definitely lost.*by [^\n]*ap_mem_alloc \\(.*by [^\n]*block \\([^)]*mem_memcheck.c:"
      FAIL_REGULAR_EXPRESSION "FAILED")
    add_test(NAME valgrind_mem_memcheck_freed COMMAND ${mem_vg} $<TARGET_FILE:mem_memcheck> freed)
    set_tests_properties(valgrind_mem_memcheck_freed PROPERTIES TIMEOUT 120 LABELS valgrind
      PASS_REGULAR_EXPRESSION "Invalid read of size 1.*0 bytes inside a block of size 100 free'd.*by [^\n]*ap_mem_free \\("
      FAIL_REGULAR_EXPRESSION "FAILED")
  endif()
endif()

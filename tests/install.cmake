# Packaging tests (see altpatch/install.cmake):
#   exports_only_altpatch  the shared library's dynamic symbols are altpatch_* only
#   install_consumer       cmake --install into a temp prefix, then build and run
#                          tests/consumer via find_package and via pkg-config, and
#                          build the tools from source against that prefix
#   archive_only_altpatch  the installed libaltpatch.a is one object whose only
#                          global symbols are altpatch_*
#   static_clash           a program defining ap_log/ap_poke/ap_nops links it
find_program(ALTPATCH_NM NAMES nm REQUIRED)
add_test(NAME exports_only_altpatch
         COMMAND ${CMAKE_COMMAND} -DNM=${ALTPATCH_NM} -DLIB=$<TARGET_FILE:altpatch>
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_exports.cmake)
set_tests_properties(exports_only_altpatch PROPERTIES LABELS "install" TIMEOUT 60)

# Consumers are built with the same compiler, and under ALTPATCH_SANITIZE with
# the same sanitizers (an instrumented library needs an instrumented program).
set(_ap_consumer_cflags "")
if(ALTPATCH_SANITIZE)
  set(_ap_consumer_cflags -fsanitize=address,undefined -fno-omit-frame-pointer)
endif()
add_test(NAME install_consumer
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.sh
                 ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/install_consumer
                 ${CMAKE_INSTALL_LIBDIR} ${CMAKE_C_COMPILER} ${_ap_consumer_cflags})
set_tests_properties(install_consumer PROPERTIES LABELS "install" TIMEOUT 300)

find_program(ALTPATCH_AR NAMES ar REQUIRED)
add_test(NAME archive_only_altpatch
         COMMAND ${CMAKE_COMMAND} -DNM=${ALTPATCH_NM} -DAR=${ALTPATCH_AR}
                 -DLIB=$<TARGET_FILE:altpatch_static>
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_archive.cmake)
set_tests_properties(archive_only_altpatch PROPERTIES LABELS "install" TIMEOUT 60)
add_executable(static_clash static_clash.c)
target_link_libraries(static_clash PRIVATE altpatch_static)
add_test(NAME static_clash COMMAND static_clash)
set_tests_properties(static_clash PROPERTIES LABELS "install" TIMEOUT 60
  PASS_REGULAR_EXPRESSION "static_clash: OK")

# The suite once under valgrind: tests/fixtures.cmake runs the
# primitive/module/corrupt tests there; these are the remaining unit tests
# that can run under valgrind (not: live patching and the races, which
# valgrind does not support; the set-uid AT_SECURE test; tests that spawn the
# tools). Label "valgrind": tools/dev.sh keeps them out of the ASan run.
find_program(ALTPATCH_VALGRIND valgrind)
if(ALTPATCH_VALGRIND)
  foreach(t test_apply test_badnote test_dialect test_insn test_known test_mem test_memo test_nop test_opts
            test_plan test_poke test_record test_reloc test_seal test_image_regions)
    if(TARGET ${t})
      add_test(NAME valgrind_${t}
               COMMAND ${ALTPATCH_VALGRIND} --quiet --error-exitcode=1 --smc-check=all
                       --leak-check=no --trace-children=yes $<TARGET_FILE:${t}> --jobs 1)
      set_tests_properties(valgrind_${t} PROPERTIES LABELS valgrind TIMEOUT 600)
    endif()
  endforeach()
  # The applies that decide again (a revert, another set, the apply after
  # them) under valgrind's default --smc-check, which does not look for
  # changes in file-backed code: the sites must run their new bytes there
  # too (the writer's spans through /proc/self/mem are not taken where the
  # machine would keep running the old ones).
  if(TARGET test_apply)
    add_test(NAME valgrind_default_smc_replans
             COMMAND ${ALTPATCH_VALGRIND} --quiet --error-exitcode=1 --leak-check=no
                     --trace-children=yes $<TARGET_FILE:test_apply> --jobs 1
                     --filter "apply/@(revert_restores_originals|another_feature_set_replans|later_applies_write_without_a_window)")
    set_tests_properties(valgrind_default_smc_replans PROPERTIES LABELS valgrind TIMEOUT 300
      FAIL_REGULAR_EXPRESSION "Tested: 0 ")
  endif()
endif()

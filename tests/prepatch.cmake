# Pre-patched files: the fixture program (testdata/prepatch_fixture.c) and the tool.
if(TARGET test_prepatch AND TARGET prepatch_fixture AND TARGET altprepatch AND TARGET altdump)
  target_compile_definitions(test_prepatch PRIVATE
    PREPATCH_FIXTURE="$<TARGET_FILE:prepatch_fixture>"
    PREPATCH_FIXTURE_NOPIE="$<TARGET_FILE:prepatch_fixture_nopie>"
    PREPATCH_FIXTURE_FORMAT1="$<TARGET_FILE:prepatch_fixture_format1>"
    ALTPREPATCH="$<TARGET_FILE:altprepatch>"
    ALTDUMP="$<TARGET_FILE:altdump>"
    PREPATCH_LIB="$<TARGET_FILE:apfix_dl>"
    PREPATCH_FIXTURE_PLAN="$<TARGET_FILE:prepatch_fixture_plan>"
    PREPATCH_LIB_PLAN="$<TARGET_FILE:apfix_dlplan>")
  add_dependencies(test_prepatch prepatch_fixture prepatch_fixture_nopie prepatch_fixture_format1
                   altprepatch altdump apfix_dl prepatch_fixture_plan apfix_dlplan)
endif()

# The same tests on the fixtures with the plan note (PREPATCH_WITH_NOTE: the
# expectations that differ are stated where they do); the plan_note tests
# run in test_prepatch only.
if(TARGET test_prepatch AND TARGET prepatch_fixture_plan_nopie)
  add_executable(test_prepatch_note ${CMAKE_CURRENT_SOURCE_DIR}/test_prepatch.c)
  target_link_libraries(test_prepatch_note PRIVATE altpatch_internal PkgConfig::CRITERION)
  target_compile_definitions(test_prepatch_note PRIVATE _GNU_SOURCE PREPATCH_WITH_NOTE=1
    PREPATCH_FIXTURE="$<TARGET_FILE:prepatch_fixture_plan>"
    PREPATCH_FIXTURE_NOPIE="$<TARGET_FILE:prepatch_fixture_plan_nopie>"
    PREPATCH_FIXTURE_FORMAT1="$<TARGET_FILE:prepatch_fixture_plan_format1>"
    ALTPREPATCH="$<TARGET_FILE:altprepatch>"
    ALTDUMP="$<TARGET_FILE:altdump>"
    PREPATCH_LIB="$<TARGET_FILE:apfix_dlplan>"
    PREPATCH_FIXTURE_PLAN="$<TARGET_FILE:prepatch_fixture_plan>"
    PREPATCH_LIB_PLAN="$<TARGET_FILE:apfix_dlplan>")
  add_dependencies(test_prepatch_note prepatch_fixture_plan prepatch_fixture_plan_nopie
                   prepatch_fixture_plan_format1 altprepatch altdump apfix_dlplan)
  add_test(NAME test_prepatch_note COMMAND test_prepatch_note --jobs 1)
  set_tests_properties(test_prepatch_note PROPERTIES TIMEOUT 300)
endif()

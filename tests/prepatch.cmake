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

# Wiring of the robustness tests (owner: engineer "fixer").
#   test_race   applies racing dlopen/dlclose of libapfix_dl.so
if(TARGET test_race)
  add_dependencies(test_race apfix_dl)
  target_link_libraries(test_race PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_race PRIVATE APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
  set_tests_properties(test_race PROPERTIES TIMEOUT 300)
endif()

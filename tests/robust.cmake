# Wiring of the robustness tests (owner: engineer "fixer").
#   test_race   applies racing dlopen/dlclose of libapfix_dl.so
if(TARGET test_race)
  add_dependencies(test_race apfix_dl)
  target_link_libraries(test_race PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_race PRIVATE APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
  set_tests_properties(test_race PROPERTIES TIMEOUT 300)
endif()

#   test_badnote  a library whose PT_NOTE lies outside its PT_LOAD segments
#                 (libapfix_badnote.so = libapfix_dl.so through move_note)
add_executable(move_note move_note.c)
target_link_libraries(move_note PRIVATE PkgConfig::LIBELF)
set(apfix_badnote ${CMAKE_CURRENT_BINARY_DIR}/libapfix_badnote.so)
add_custom_command(OUTPUT ${apfix_badnote}
  COMMAND move_note $<TARGET_FILE:apfix_dl> ${apfix_badnote} 0x40000000
  DEPENDS move_note apfix_dl
  COMMENT "libapfix_badnote.so: libapfix_dl.so with its PT_NOTE outside the loaded segments"
  VERBATIM)
add_custom_target(apfix_badnote DEPENDS ${apfix_badnote})
if(TARGET test_badnote)
  add_dependencies(test_badnote apfix_badnote)
  target_link_libraries(test_badnote PRIVATE ${CMAKE_DL_LIBS})
  target_compile_definitions(test_badnote PRIVATE APFIX_BADNOTE_PATH="${apfix_badnote}"
    APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
endif()

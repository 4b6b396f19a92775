# Wiring of the robustness tests.
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

# Robustness of re-patching (tests/test_robust.c, tests/robust_dlcycles.c):
#   libreload_v{1,2,3,4}.so  one plugin built with four contents (reload_plugin.c)
#   robust_dlcycles        altpatch_dlopen/dlclose at moving addresses with a
#                          thread running sites: heap growth (ctest: 1000 cycles;
#                          exit 77: skipped, no live patching on this kernel)
foreach(v 1 2 3 4)
  add_library(reload_v${v} SHARED reload_plugin.c)
  target_include_directories(reload_v${v} PRIVATE ${PROJECT_SOURCE_DIR}/altpatch/include)
  set_target_properties(reload_v${v} PROPERTIES C_VISIBILITY_PRESET hidden)
endforeach()
target_compile_definitions(reload_v1 PRIVATE RELOAD_ORIG=1 RELOAD_REPL=2)
target_compile_definitions(reload_v2 PRIVATE RELOAD_ORIG=1 RELOAD_REPL=3)
target_compile_definitions(reload_v3 PRIVATE RELOAD_ORIG=7 RELOAD_REPL=3)
target_compile_definitions(reload_v4 PRIVATE RELOAD_ORIG=7 RELOAD_REPL=3 RELOAD_NEVER=1)
# test_apply loads the three at once: modules out of address order; and
# libaphost_records.so (live.cmake): sites outside a module's text
if(TARGET test_apply)
  add_dependencies(test_apply reload_v1 reload_v2 reload_v3 reload_v4 aphost_records)
  target_link_libraries(test_apply PRIVATE ${CMAKE_DL_LIBS})
  target_compile_definitions(test_apply PRIVATE
    RELOAD_V1="$<TARGET_FILE:reload_v1>" RELOAD_V2="$<TARGET_FILE:reload_v2>"
    RELOAD_V3="$<TARGET_FILE:reload_v3>" RELOAD_V4="$<TARGET_FILE:reload_v4>"
    APH_RECORDS="$<TARGET_FILE:aphost_records>")
endif()
#   librobust_forkctor.so  a constructor that raises SIGUSR1 (a handler forks
#                          inside altpatch_dlopen)
add_library(robust_forkctor SHARED robust_forkctor.c)
if(TARGET test_robust)
  add_dependencies(test_robust reload_v1 reload_v2 reload_v3 reload_v4 apfix_dl robust_forkctor)
  target_link_libraries(test_robust PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_robust PRIVATE
    RELOAD_V1="$<TARGET_FILE:reload_v1>" RELOAD_V2="$<TARGET_FILE:reload_v2>"
    RELOAD_V3="$<TARGET_FILE:reload_v3>" RELOAD_V4="$<TARGET_FILE:reload_v4>"
    ROBUST_FORKCTOR="$<TARGET_FILE:robust_forkctor>")
endif()

add_executable(robust_dlcycles robust_dlcycles.c)
target_compile_definitions(robust_dlcycles PRIVATE _GNU_SOURCE
  APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
target_link_libraries(robust_dlcycles PRIVATE altpatch pthread ${CMAKE_DL_LIBS})
add_dependencies(robust_dlcycles apfix_dl)
add_test(NAME robust_dlcycles COMMAND robust_dlcycles --cycles 1000)
set_tests_properties(robust_dlcycles PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "robust_dlcycles: ok" SKIP_RETURN_CODE 77)

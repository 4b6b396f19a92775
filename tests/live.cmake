# Live re-patching and hardening (docs/live.md, docs/hardening.md).
#   stress_live          worker threads run sites while main toggles them live
#                        (tests/stress_live.c); ctest runs 200 toggles, the
#                        `stress` target 100k (not part of ctest); exit 77:
#                        skipped (no live patching on this kernel)
#   live_toggle_bench    what one live toggle costs (not part of ctest)
#   libaphost_*.so       hostile-record modules (testdata/hostile/*.S)
#   hostile_secure_helper  run set-uid root as an unprivileged user by test_hostile
enable_language(ASM)

add_executable(stress_live stress_live.c)
target_compile_definitions(stress_live PRIVATE _GNU_SOURCE)
target_link_libraries(stress_live PRIVATE altpatch pthread)
add_test(NAME stress_live_short COMMAND stress_live --toggles 200)
set_tests_properties(stress_live_short PROPERTIES TIMEOUT 120
  PASS_REGULAR_EXPRESSION "wrong=0 apply_errors=0" SKIP_RETURN_CODE 77)
add_test(NAME stress_live_sigtrap_blocked COMMAND stress_live --toggles 300 --sigtrap-blocked)
set_tests_properties(stress_live_sigtrap_blocked PROPERTIES TIMEOUT 120
  PASS_REGULAR_EXPRESSION "wrong=0 apply_errors=0 \\(first 0\\) ebusy=0 " SKIP_RETURN_CODE 77)
# The cost of one live toggle (docs/live.md): a figure, not a test.
add_executable(live_toggle_bench live_toggle_bench.c)
target_compile_definitions(live_toggle_bench PRIVATE _GNU_SOURCE)
target_link_libraries(live_toggle_bench PRIVATE altpatch pthread)
set(ALTPATCH_STRESS_TOGGLES 100000 CACHE STRING "toggles of the `stress` target")
add_custom_target(stress
  COMMAND stress_live --toggles ${ALTPATCH_STRESS_TOGGLES}
  DEPENDS stress_live USES_TERMINAL
  COMMENT "stress_live: ${ALTPATCH_STRESS_TOGGLES} live toggles under 4 threads")

set(APH_DIR ${PROJECT_SOURCE_DIR}/testdata/hostile)
set(APH_MODULES records recsize descsz inverted misaligned table_out repl_out v3recsize v3table
    wtable ttable)
foreach(m ${APH_MODULES})
  add_library(aphost_${m} SHARED ${APH_DIR}/${m}.S)
  set_source_files_properties(${APH_DIR}/${m}.S PROPERTIES
    OBJECT_DEPENDS ${APH_DIR}/hostile.inc)
  target_include_directories(aphost_${m} PRIVATE ${APH_DIR})
  target_link_options(aphost_${m} PRIVATE -Wl,-z,noexecstack)
  set_target_properties(aphost_${m} PROPERTIES LINKER_LANGUAGE C)
endforeach()
# One refused record among valid ones, of each kind (testdata/hostile/onebad.S).
set(APH_ONEBAD 0 1 2 3 4 5)
foreach(k ${APH_ONEBAD})
  add_library(aphost_onebad_${k} SHARED ${APH_DIR}/onebad.S)
  target_compile_definitions(aphost_onebad_${k} PRIVATE APH_BAD=${k})
  target_include_directories(aphost_onebad_${k} PRIVATE ${APH_DIR})
  target_link_options(aphost_onebad_${k} PRIVATE -Wl,-z,noexecstack)
  set_target_properties(aphost_onebad_${k} PROPERTIES LINKER_LANGUAGE C)
  list(APPEND APH_MODULES onebad_${k})
endforeach()
set_source_files_properties(${APH_DIR}/onebad.S PROPERTIES OBJECT_DEPENDS ${APH_DIR}/hostile.inc)

add_executable(hostile_secure_helper hostile_secure_helper.c)
target_compile_definitions(hostile_secure_helper PRIVATE _GNU_SOURCE)
target_link_libraries(hostile_secure_helper PRIVATE altpatch_static)

if(TARGET test_hostile)
  foreach(m ${APH_MODULES})
    add_dependencies(test_hostile aphost_${m})
  endforeach()
  add_dependencies(test_hostile hostile_secure_helper)
  target_link_libraries(test_hostile PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_hostile PRIVATE
    APH_LIBDIR="$<TARGET_FILE_DIR:aphost_records>"
    APH_HELPER="$<TARGET_FILE:hostile_secure_helper>"
    APH_SANITIZED=$<BOOL:${ALTPATCH_SANITIZE}>)
endif()
if(TARGET test_live)
  target_link_libraries(test_live PRIVATE pthread)
endif()

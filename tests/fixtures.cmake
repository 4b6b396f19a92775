# Wiring of the fixture-based tests (testdata/): fixture paths as compile
# definitions, build dependencies, and the valgrind runs.
if(TARGET test_fixtures)
  string(REPLACE ";" "," apfix_variants "${APFIX_VARIANTS}")
  target_compile_definitions(test_fixtures PRIVATE
    APFIX_DIR="${APFIX_DIR}"
    APFIX_STATIC_SKIP="${APFIX_STATIC_SKIP}"
    APFIX_OTHER_NAME="${APFIX_OTHER_NAME}"
    APFIX_OTHER_SKIP="${APFIX_OTHER_SKIP}")
  foreach(v ${APFIX_VARIANTS})
    add_dependencies(test_fixtures apfix_${v})
  endforeach()
  if(APFIX_OTHER_NAME)
    add_dependencies(test_fixtures apfix_other)
  endif()
endif()

if(TARGET test_primitives OR TARGET test_modules OR TARGET test_corrupt)
  foreach(t test_primitives test_modules test_corrupt)
    if(TARGET ${t})
      target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/testdata)
      target_compile_definitions(${t} PRIVATE APFIX_DIR="${APFIX_DIR}")
    endif()
  endforeach()
endif()
if(TARGET test_fixtures)
  target_include_directories(test_fixtures PRIVATE ${CMAKE_SOURCE_DIR}/testdata)
endif()

if(TARGET test_modules)
  # libapfix_linked.so is a DT_NEEDED of the test; libapfix_dl.so,
  # libapfix_big.so and libapfix_shapes.so are dlopen'ed.
  target_link_libraries(test_modules PRIVATE apfix_linked ${CMAKE_DL_LIBS})
  add_dependencies(test_modules apfix_dl apfix_big apfix_shapes)
  target_compile_definitions(test_modules PRIVATE
    APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>" APFIX_BIG_PATH="$<TARGET_FILE:apfix_big>"
    APFIX_SHAPES_PATH="$<TARGET_FILE:apfix_shapes>")
endif()

# test_modules_oom: out of memory where a first apply's write queue grows. Its
# own executable: it interposes realloc() for the whole process, which a
# sanitizer's allocator does not allow.
if(TARGET test_modules AND NOT ALTPATCH_SANITIZE)
  add_executable(test_modules_oom ${CMAKE_CURRENT_SOURCE_DIR}/modules_oom.c)
  target_compile_definitions(test_modules_oom PRIVATE _GNU_SOURCE
    APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
  target_include_directories(test_modules_oom PRIVATE ${CMAKE_SOURCE_DIR}/testdata)
  target_link_libraries(test_modules_oom PRIVATE altpatch_internal PkgConfig::CRITERION apfix_linked
    ${CMAKE_DL_LIBS})
  add_dependencies(test_modules_oom apfix_dl)
  add_test(NAME test_modules_oom COMMAND test_modules_oom --jobs 1)
  set_tests_properties(test_modules_oom PROPERTIES TIMEOUT 300)
endif()

if(TARGET test_corrupt)
  add_dependencies(test_corrupt apfix_corrupt apfix_corrupt_badtable apfix_corrupt_badversion)
  target_link_libraries(test_corrupt PRIVATE ${CMAKE_DL_LIBS})
  target_compile_definitions(test_corrupt PRIVATE
    APFIX_CORRUPT_PATH="$<TARGET_FILE:apfix_corrupt>"
    APFIX_BADTABLE_PATH="$<TARGET_FILE:apfix_corrupt_badtable>"
    APFIX_BADVERSION_PATH="$<TARGET_FILE:apfix_corrupt_badversion>")
endif()

# Valgrind: FSGSBASE is hidden there (rdfsbase would raise SIGILL), so the
# runtime must keep the fs/gs originals; test_primitives checks it when
# ALTPATCH_TEST_VALGRIND=1. No --smc-check: the sites run before and after
# patching, and valgrind must pick up the rewrite by itself (it drops its
# translations when the runtime's mprotect window takes PROT_EXEC away).
find_program(VALGRIND_EXECUTABLE valgrind)
if(VALGRIND_EXECUTABLE AND NOT ALTPATCH_SANITIZE) # ASan binaries do not run under valgrind
  set(apfix_vg ${VALGRIND_EXECUTABLE} --quiet --trace-children=yes --error-exitcode=1
    --leak-check=no)
  foreach(t test_primitives test_modules test_corrupt test_parts)
    if(TARGET ${t})
      add_test(NAME valgrind_${t} COMMAND ${apfix_vg} $<TARGET_FILE:${t}> --jobs 1)
      set_tests_properties(valgrind_${t} PROPERTIES TIMEOUT 600
        ENVIRONMENT "ALTPATCH_TEST_VALGRIND=1" LABELS valgrind)
    endif()
  endforeach()
  if(TARGET apfix_O2)
    add_test(NAME valgrind_apfix_O2 COMMAND ${apfix_vg} $<TARGET_FILE:apfix_O2>)
    # Exit status: 1 for a valgrind error or a failed check (a pass regex
    # would make ctest ignore it).
    set_tests_properties(valgrind_apfix_O2 PROPERTIES TIMEOUT 300 LABELS valgrind)
    # The CPU matrix under valgrind: explicit feature sets, bytes checked, not run.
    foreach(fs baseline intel-spr amd-zen4)
      add_test(NAME valgrind_apfix_O2_${fs} COMMAND ${apfix_vg} $<TARGET_FILE:apfix_O2>)
      set_tests_properties(valgrind_apfix_O2_${fs} PROPERTIES TIMEOUT 300 LABELS valgrind
        ENVIRONMENT "APFIX_FEATURES=${fs}")
    endforeach()
  endif()
endif()

# The demo checks its own values and exits non-zero on any failure.
if(TARGET altdemo)
  add_test(NAME altdemo COMMAND altdemo)
  set_tests_properties(altdemo PROPERTIES TIMEOUT 60)
  # The same checks with every feature the primitives use cleared (their
  # originals, as on a baseline CPU), under valgrind, and under qemu-user's
  # CPU models (other CPUID answers: an AMD one without RDTSCP, RDPID or
  # FSGSBASE, an Intel one).
  add_test(NAME altdemo_originals COMMAND altdemo)
  set_tests_properties(altdemo_originals PROPERTIES TIMEOUT 60
    ENVIRONMENT "ALTPATCH_CLEARCPUID=fsgsbase,rdpid,rdtscp,lfence_rdtsc")
  if(VALGRIND_EXECUTABLE AND NOT ALTPATCH_SANITIZE)
    add_test(NAME valgrind_altdemo COMMAND ${apfix_vg} $<TARGET_FILE:altdemo>)
    set_tests_properties(valgrind_altdemo PROPERTIES TIMEOUT 300 LABELS valgrind)
  endif()
  find_program(QEMU_X86_64_EXECUTABLE qemu-x86_64)
  if(QEMU_X86_64_EXECUTABLE AND NOT ALTPATCH_SANITIZE)
    foreach(cpu qemu64 EPYC-Rome-v1 Haswell-v4)
      # qemu's helper thread blocks SIGTRAP, so apply may refuse with -EBUSY
      # (docs/live.md); the script then still requires every check of the
      # originals to pass under that CPU model.
      add_test(NAME qemu_altdemo_${cpu} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/qemu_demo.sh
        ${QEMU_X86_64_EXECUTABLE} ${cpu} $<TARGET_FILE:altdemo>)
      set_tests_properties(qemu_altdemo_${cpu} PROPERTIES TIMEOUT 120 LABELS qemu)
    endforeach()
  else()
    message(STATUS "qemu-x86_64 not found (Debian package qemu-user): qemu_altdemo_* not run")
  endif()
endif()

# test_parts_mods: the test program and libapfix_dl.so (dlopen'ed) in one apply.
if(TARGET test_parts_mods)
  target_link_libraries(test_parts_mods PRIVATE ${CMAKE_DL_LIBS})
  add_dependencies(test_parts_mods apfix_dl)
  target_compile_definitions(test_parts_mods PRIVATE APFIX_DL_PATH="$<TARGET_FILE:apfix_dl>")
endif()

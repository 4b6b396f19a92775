# altdump tests: fixtures (assembled .S at fixed addresses), the live --pid
# fixture, test_altdump wiring, and the libFuzzer harness (built with clang).
if(NOT TARGET altdump OR NOT TARGET test_altdump)
  return()
endif()

set(AD_SRC ${PROJECT_SOURCE_DIR}/testdata/altdump)
set(AD_FIX ${CMAKE_CURRENT_BINARY_DIR}/altdump-fixtures)
file(MAKE_DIRECTORY ${AD_FIX})

# --- Golden fixtures: sites.S (with alternatives) and plain (-DNO_ALT) ------
# Assembled from fixed bytes and linked with sites.ld, so addresses and bytes
# do not depend on the compiler or linker version.
set(AD_FIX_OUTPUTS)
foreach(v sites plain)
  set(defs)
  if(v STREQUAL "plain")
    set(defs -DNO_ALT)
  endif()
  add_custom_command(OUTPUT ${AD_FIX}/${v}.o ${AD_FIX}/${v}.elf
    COMMAND ${CMAKE_C_COMPILER} ${defs} -I${AD_SRC} -c ${AD_SRC}/sites.S -o ${AD_FIX}/${v}.o
    COMMAND ${CMAKE_C_COMPILER} -nostdlib -static -Wl,-T,${AD_SRC}/sites.ld
      -Wl,--build-id=none -Wl,-z,noexecstack -o ${AD_FIX}/${v}.elf ${AD_FIX}/${v}.o
    DEPENDS ${AD_SRC}/sites.S ${AD_SRC}/altsites.inc ${AD_SRC}/sites.ld
    COMMENT "altdump fixture ${v}" VERBATIM)
  list(APPEND AD_FIX_OUTPUTS ${AD_FIX}/${v}.o ${AD_FIX}/${v}.elf)
endforeach()

# many.S: 20 function sections (more than struct ap_view holds) -> .o and .so.
add_custom_command(OUTPUT ${AD_FIX}/many.o ${AD_FIX}/many.so
  COMMAND ${CMAKE_C_COMPILER} -I${AD_SRC} -c ${AD_SRC}/many.S -o ${AD_FIX}/many.o
  COMMAND ${CMAKE_C_COMPILER} -shared -nostdlib -Wl,--build-id=none -Wl,-z,noexecstack
    -o ${AD_FIX}/many.so ${AD_FIX}/many.o
  DEPENDS ${AD_SRC}/many.S ${AD_SRC}/altsites.inc
  COMMENT "altdump fixture many" VERBATIM)
list(APPEND AD_FIX_OUTPUTS ${AD_FIX}/many.o ${AD_FIX}/many.so)

# wide.S: 500 sites in one function: a dump larger than a pipe holds -> .so.
add_custom_command(OUTPUT ${AD_FIX}/wide.so
  COMMAND ${CMAKE_C_COMPILER} -I${AD_SRC} -shared -nostdlib -Wl,--build-id=none
    -Wl,-z,noexecstack -o ${AD_FIX}/wide.so ${AD_SRC}/wide.S
  DEPENDS ${AD_SRC}/wide.S ${AD_SRC}/altsites.inc
  COMMENT "altdump fixture wide" VERBATIM)
list(APPEND AD_FIX_OUTPUTS ${AD_FIX}/wide.so)

# groups.S: sites in COMDAT groups ("a?R" records, as alternative.h emits for
# C++ inline functions): several altinstructions sections in the .o -> .o, .so,
# and a program linked with the shared libaltpatch (runtime side).
add_custom_command(OUTPUT ${AD_FIX}/groups.o ${AD_FIX}/groups.so
  COMMAND ${CMAKE_C_COMPILER} -I${AD_SRC} -c ${AD_SRC}/groups.S -o ${AD_FIX}/groups.o
  COMMAND ${CMAKE_C_COMPILER} -shared -nostdlib -Wl,--build-id=none -Wl,-z,noexecstack
    -o ${AD_FIX}/groups.so ${AD_FIX}/groups.o
  DEPENDS ${AD_SRC}/groups.S ${AD_SRC}/altsites.inc
  COMMENT "altdump fixture groups" VERBATIM)
list(APPEND AD_FIX_OUTPUTS ${AD_FIX}/groups.o ${AD_FIX}/groups.so)

# kernel.S: Linux-kernel-style tables (.altinstructions, no altpatch note) in
# both record layouts: a module (.o with RELA, vermagic) and a linked image
# (linux_banner) per layout, and modules without any version string (one
# whose table size tells the layout, one whose size fits both).
foreach(k "61;12;6.1.0-99-test;" "612;14;6.12.99+test;" "nover;14;x;-DNOVERSION=1"
         "ambig;14;x;-DNOVERSION=2")
  list(GET k 0 kname)
  list(GET k 1 krec)
  list(GET k 2 kver)
  list(GET k 3 kextra)
  set(kdefs -DKREC_SIZE=${krec} "-DKVERSION=\"${kver}\"" ${kextra})
  add_custom_command(OUTPUT ${AD_FIX}/kernel${kname}.o ${AD_FIX}/kernel${kname}.elf
    COMMAND ${CMAKE_C_COMPILER} ${kdefs} -DMODULE -c ${AD_SRC}/kernel.S
      -o ${AD_FIX}/kernel${kname}.o
    COMMAND ${CMAKE_C_COMPILER} ${kdefs} -c ${AD_SRC}/kernel.S -o ${AD_FIX}/kernel${kname}-img.o
    COMMAND ${CMAKE_C_COMPILER} -nostdlib -static -Wl,-T,${AD_SRC}/kernel.ld
      -Wl,--build-id=none -Wl,-z,noexecstack -o ${AD_FIX}/kernel${kname}.elf
      ${AD_FIX}/kernel${kname}-img.o
    DEPENDS ${AD_SRC}/kernel.S ${AD_SRC}/kernel.ld
    COMMENT "altdump fixture kernel${kname}" VERBATIM)
  list(APPEND AD_FIX_OUTPUTS ${AD_FIX}/kernel${kname}.o ${AD_FIX}/kernel${kname}.elf)
endforeach()

# --- Corrupt-record fixtures of testdata/, rebuilt here
# so that this test does not depend on their target names.
set(AD_HAVE_CORRUPT 0)
if(EXISTS ${PROJECT_SOURCE_DIR}/testdata/corrupt.S AND
   EXISTS ${PROJECT_SOURCE_DIR}/testdata/corrupt_badtable.S AND
   EXISTS ${PROJECT_SOURCE_DIR}/testdata/corrupt_badversion.S AND
   EXISTS ${PROJECT_SOURCE_DIR}/testdata/README.md)
  set(AD_HAVE_CORRUPT 1)
  foreach(m corrupt corrupt_badtable corrupt_badversion)
    add_custom_command(OUTPUT ${AD_FIX}/lib${m}.so
      COMMAND ${CMAKE_C_COMPILER} -shared -nostdlib -I${PROJECT_SOURCE_DIR}/testdata
        -Wl,-z,noexecstack -Wl,--build-id=none -o ${AD_FIX}/lib${m}.so
        ${PROJECT_SOURCE_DIR}/testdata/${m}.S
      DEPENDS ${PROJECT_SOURCE_DIR}/testdata/${m}.S ${PROJECT_SOURCE_DIR}/testdata/corrupt_common.inc
      COMMENT "altdump fixture lib${m}.so" VERBATIM)
    list(APPEND AD_FIX_OUTPUTS ${AD_FIX}/lib${m}.so)
  endforeach()
endif()
add_custom_target(altdump_fixtures DEPENDS ${AD_FIX_OUTPUTS})

# --- The live process for --pid (sites through <altpatch/alternative.h>) ----
# Built from an object library so the test can also read the very .o it was
# linked from (.o vs linked program on C code compiled with the real macros).
add_library(altdump_live_obj OBJECT ${AD_SRC}/live.c)
# -g in every build type: its .rela.debug_* sections are what altdump must not read
target_compile_options(altdump_live_obj PRIVATE -O2 -g -mno-red-zone)
target_link_libraries(altdump_live_obj PRIVATE altpatch_static)
add_executable(altdump_live $<TARGET_OBJECTS:altdump_live_obj>)
target_link_libraries(altdump_live PRIVATE altpatch_static ${CMAKE_DL_LIBS})

add_executable(altdump_groups_run ${AD_SRC}/groups_main.c ${AD_FIX}/groups.o)
set_source_files_properties(${AD_FIX}/groups.o PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
target_link_libraries(altdump_groups_run PRIVATE altpatch)
target_link_options(altdump_groups_run PRIVATE -Wl,-z,noexecstack)

# Objects of both record formats in one program (format 3 linked first).
add_executable(altdump_mixed ${AD_SRC}/mixed_a.c ${AD_SRC}/mixed_b.c ${AD_SRC}/mixed_main.c)
target_link_libraries(altdump_mixed PRIVATE altpatch)

# A preload that truncates a ".cut" file at altdump's first read of it.
add_library(altdump_cut_pread MODULE altdump_cut_pread.c)
target_compile_definitions(altdump_cut_pread PRIVATE _GNU_SOURCE)
target_link_libraries(altdump_cut_pread PRIVATE ${CMAKE_DL_LIBS})

target_compile_definitions(test_altdump PRIVATE
  ALTDUMP_CUT_PREAD="$<TARGET_FILE:altdump_cut_pread>"
  ALTDUMP_MIXED="$<TARGET_FILE:altdump_mixed>"
  ALTDUMP_GROUPS_RUN="$<TARGET_FILE:altdump_groups_run>"
  ALTDUMP_BIN="$<TARGET_FILE:altdump>"
  ALTDUMP_LIVE="$<TARGET_FILE:altdump_live>"
  ALTDUMP_LIVE_OBJ="$<TARGET_OBJECTS:altdump_live_obj>"
  ALTDUMP_FIXDIR="${AD_FIX}"
  ALTDUMP_GOLDEN="${AD_SRC}/golden"
  ALTDUMP_TESTDATA="${PROJECT_SOURCE_DIR}/testdata"
  ALTDUMP_HAVE_CORRUPT=${AD_HAVE_CORRUPT})
target_link_libraries(test_altdump PRIVATE PkgConfig::LIBELF)
add_dependencies(test_altdump altdump altdump_live altdump_fixtures altdump_groups_run
                 altdump_mixed altdump_cut_pread)

# --- Fuzz harness: libFuzzer needs clang; built by a test, then run ~60 s ---
find_program(ALTDUMP_CLANG NAMES clang clang-14)
set(AD_FUZZ_OK 0)
if(ALTDUMP_CLANG)
  set(probe ${CMAKE_CURRENT_BINARY_DIR}/altdump_fuzz_probe.c)
  file(WRITE ${probe} "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${ALTDUMP_CLANG} -fsanitize=fuzzer,address,undefined ${probe}
      -o ${CMAKE_CURRENT_BINARY_DIR}/altdump_fuzz_probe
    RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(AD_FUZZ_OK 1)
  endif()
endif()

if(AD_FUZZ_OK)
  file(GLOB AD_LIB_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/altpatch/src/*.c)
  set(fuzz_bin ${CMAKE_CURRENT_BINARY_DIR}/altdump_fuzz)
  # disasm.c formats through Zydis' formatter buffer, which is Zycore's string.
  if(TARGET Zycore::Zycore)
    set(AD_ZYCORE $<TARGET_FILE:Zycore::Zycore>)
  else()
    set(AD_ZYCORE -lZycore)
  endif()
  add_custom_command(OUTPUT ${fuzz_bin}
    COMMAND ${ALTDUMP_CLANG} -std=gnu11 -g -O1 -D_GNU_SOURCE
      -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
      -I${PROJECT_SOURCE_DIR}/altpatch/include -I${ALTPATCH_GEN_DIR}
      -I${PROJECT_SOURCE_DIR}/tools/altdump
      ${PROJECT_SOURCE_DIR}/tools/altdump/fuzz.c ${ALTDUMP_SOURCES} ${AD_LIB_SOURCES}
      -o ${fuzz_bin} $<TARGET_FILE:Zydis::Zydis> ${AD_ZYCORE} -lelf -ldl -lpthread
    DEPENDS ${PROJECT_SOURCE_DIR}/tools/altdump/fuzz.c ${ALTDUMP_SOURCES} ${AD_LIB_SOURCES}
            altpatch_features_inc
    COMMENT "Building the altdump fuzz harness with clang (libFuzzer, ASan, UBSan)" VERBATIM)
  add_custom_target(altdump_fuzz DEPENDS ${fuzz_bin})
  add_test(NAME altdump_fuzz_build
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target altdump_fuzz)
  set_tests_properties(altdump_fuzz_build PROPERTIES FIXTURES_SETUP altdump_fuzz TIMEOUT 600)
  add_test(NAME altdump_fuzz
    COMMAND sh -c "mkdir -p fuzz-corpus && exec \"$0\" -max_total_time=60 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 fuzz-corpus \"$1\""
      ${fuzz_bin} ${AD_SRC}/corpus
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(altdump_fuzz PROPERTIES FIXTURES_REQUIRED altdump_fuzz TIMEOUT 300)
else()
  add_test(NAME altdump_fuzz
    COMMAND sh -c "echo 'altdump_fuzz: skipped: clang with libFuzzer (-fsanitize=fuzzer) not found'; exit 77")
  set_tests_properties(altdump_fuzz PROPERTIES SKIP_RETURN_CODE 77)
endif()

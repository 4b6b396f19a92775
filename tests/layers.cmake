# The floors of altpatch/src (docs/architecture.md): no file includes the
# header of a higher floor, only insn.c includes Zydis, and no object uses a
# name defined on a higher floor (nm over the library's objects).
add_test(NAME layers
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_layers.sh ${PROJECT_SOURCE_DIR}/altpatch/src
          $<TARGET_OBJECTS:altpatch_objs>
  COMMAND_EXPAND_LISTS)
set_tests_properties(layers PROPERTIES PASS_REGULAR_EXPRESSION "layers: OK")

# The tools are clients like any other: public headers only. Disabled while
# altdump still includes the library's internal headers (tools/altdump/altdump.h
# includes host.h: its reading of ELF files and kernel images is not yet on
# the image API of <altpatch/image.h>); enable it when that include is gone.
add_test(NAME layers_tools
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_layers.sh --tools ${PROJECT_SOURCE_DIR}/tools)
set_tests_properties(layers_tools PROPERTIES PASS_REGULAR_EXPRESSION "layers: OK"
  DISABLED TRUE)

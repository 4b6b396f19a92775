# The floors of altpatch/src (docs/architecture.md): no file includes the
# header of a higher floor, only insn.c includes Zydis, and no object uses a
# name defined on a higher floor (nm over the library's objects).
add_test(NAME layers
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_layers.sh ${PROJECT_SOURCE_DIR}/altpatch/src
          $<TARGET_OBJECTS:altpatch_objs>
  COMMAND_EXPAND_LISTS)
set_tests_properties(layers PROPERTIES PASS_REGULAR_EXPRESSION "layers: OK")

# The tools are clients like any other: public headers only (altdump reads
# and plans through <altpatch/image.h>; tests/consumer also builds every tool
# against an installed prefix).
add_test(NAME layers_tools
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_layers.sh --tools ${PROJECT_SOURCE_DIR}/tools)
set_tests_properties(layers_tools PROPERTIES PASS_REGULAR_EXPRESSION "layers: OK")

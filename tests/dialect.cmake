# test_dialect: the primitives compiled with -masm=intel.
target_sources(test_dialect PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/dialect_intel.c)
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/dialect_intel.c PROPERTIES COMPILE_OPTIONS -masm=intel)

# test_undo starts a thread from the print callback in the middle of an apply,
# and loads libundo_lib.so (tests/undo_lib.c) after its first apply.
add_library(undo_lib SHARED undo_lib.c)
target_include_directories(undo_lib PRIVATE ${PROJECT_SOURCE_DIR}/altpatch/include)
set_target_properties(undo_lib PROPERTIES C_VISIBILITY_PRESET hidden)
if(TARGET test_undo)
  add_dependencies(test_undo undo_lib)
  target_link_libraries(test_undo PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_undo PRIVATE UNDO_LIB="$<TARGET_FILE:undo_lib>")
endif()

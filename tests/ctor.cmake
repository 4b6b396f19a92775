# test_ctor: a library whose constructor calls altpatch_apply().
add_library(ctor_apply_lib SHARED ${CMAKE_CURRENT_SOURCE_DIR}/ctor_apply_lib.c)
target_link_libraries(ctor_apply_lib PRIVATE altpatch)
if(TARGET test_ctor)
  add_dependencies(test_ctor ctor_apply_lib)
  target_link_libraries(test_ctor PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_ctor PRIVATE CTOR_APPLY_LIB_PATH="$<TARGET_FILE:ctor_apply_lib>")
endif()
if(TARGET test_ctor)
  # The plugin's altpatch_* calls must bind to the copy in the test program
  # (one library, one lock), not to a second copy in libaltpatch.so.
  set_target_properties(test_ctor PROPERTIES ENABLE_EXPORTS ON)
endif()

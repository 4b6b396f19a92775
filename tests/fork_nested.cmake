# test_fork_nested: its helper program (tests/fork_nested_helper.c).
add_executable(fork_nested_helper fork_nested_helper.c)
target_compile_definitions(fork_nested_helper PRIVATE _GNU_SOURCE)
target_link_libraries(fork_nested_helper PRIVATE altpatch_internal pthread ${CMAKE_DL_LIBS})
# robust_forkctor (robust.cmake): a constructor that raises SIGUSR1
add_dependencies(fork_nested_helper robust_forkctor)
target_compile_definitions(fork_nested_helper PRIVATE
  FORKCTOR_LIB="$<TARGET_FILE:robust_forkctor>")
if(TARGET test_fork_nested)
  add_dependencies(test_fork_nested fork_nested_helper)
  target_compile_definitions(test_fork_nested PRIVATE
    FORK_NESTED_HELPER="$<TARGET_FILE:fork_nested_helper>")
endif()

# test_gate: threads inside the loader's gate while a handler forks.
if(TARGET test_gate)
  target_link_libraries(test_gate PRIVATE pthread)
endif()

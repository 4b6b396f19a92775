# test_proof loads a module whose table is refused while the modules are walked
# (testdata/hostile/recsize.S: a warning before any decision).
if(TARGET test_proof AND TARGET aphost_recsize)
  add_dependencies(test_proof aphost_recsize)
  target_link_libraries(test_proof PRIVATE ${CMAKE_DL_LIBS} pthread)
  target_compile_definitions(test_proof PRIVATE
    PROOF_REFUSED_SO="$<TARGET_FILE:aphost_recsize>")
endif()

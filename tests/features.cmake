# The feature list: test_cpu reads <altpatch/cpufeatures.h> itself (an oracle
# for the generated known set), and the generator refuses a list with one id
# or one name twice.
if(TARGET test_cpu)
  target_compile_definitions(test_cpu PRIVATE
    AP_CPUFEATURES_H="${PROJECT_SOURCE_DIR}/altpatch/include/altpatch/cpufeatures.h")
endif()
foreach(dup id name)
  add_test(NAME gen_features_refuses_dup_${dup}
    COMMAND ${CMAKE_COMMAND} -DIN=${PROJECT_SOURCE_DIR}/testdata/features/dup_${dup}.h
      -DOUT=${CMAKE_CURRENT_BINARY_DIR}/features_dup_${dup}.inc
      -P ${PROJECT_SOURCE_DIR}/altpatch/gen_features.cmake)
endforeach()
set_tests_properties(gen_features_refuses_dup_id PROPERTIES
  PASS_REGULAR_EXPRESSION "feature 0\\*32\\+0 defined twice")
set_tests_properties(gen_features_refuses_dup_name PROPERTIES
  PASS_REGULAR_EXPRESSION "name \"fpu\" used twice")

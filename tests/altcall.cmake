# ALTPATCH_ALT_CALL: unwinding through the site (C and C++) and code models.
#   test_altcall       C, built with -fexceptions: backtrace(3), _Unwind_Backtrace,
#                      pthread_cancel with an unwinding cleanup handler
#   test_altcall_cxx   C++: an exception and a cancellation through the site
#   altcall_medium     the site built with -mcmodel=medium works before/after apply
#   altcall_large_*    under -mcmodel=large the site stops the compilation with a message
if(TARGET test_altcall)
  set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/test_altcall.c
    PROPERTIES COMPILE_OPTIONS -fexceptions)
  target_link_libraries(test_altcall PRIVATE pthread)
endif()

include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  enable_language(CXX)
  add_executable(test_altcall_cxx ${CMAKE_CURRENT_SOURCE_DIR}/altcall_cxx.cpp)
  target_link_libraries(test_altcall_cxx PRIVATE altpatch_internal PkgConfig::CRITERION pthread)
  add_test(NAME test_altcall_cxx COMMAND test_altcall_cxx --jobs 1)
  set_tests_properties(test_altcall_cxx PROPERTIES TIMEOUT 300)
else()
  message(STATUS "no C++ compiler: test_altcall_cxx not built")
endif()

add_executable(altcall_medium ${CMAKE_CURRENT_SOURCE_DIR}/altcall_model.c)
target_compile_options(altcall_medium PRIVATE -mcmodel=medium)
target_link_libraries(altcall_medium PRIVATE altpatch_static)
add_test(NAME altcall_medium COMMAND altcall_medium)
set_tests_properties(altcall_medium PROPERTIES PASS_REGULAR_EXPRESSION "before 11, after 21")

set(ALTPATCH_LARGE_MSG "ALTPATCH_ALT_CALL is not available under -mcmodel=large")
add_test(NAME altcall_large_c
  COMMAND ${CMAKE_C_COMPILER} -I${PROJECT_SOURCE_DIR}/altpatch/include -mcmodel=large
          -fsyntax-only -x c ${CMAKE_CURRENT_SOURCE_DIR}/altcall_model.c)
set_tests_properties(altcall_large_c PROPERTIES PASS_REGULAR_EXPRESSION "${ALTPATCH_LARGE_MSG}")
if(CMAKE_CXX_COMPILER)
  add_test(NAME altcall_large_cxx
    COMMAND ${CMAKE_CXX_COMPILER} -I${PROJECT_SOURCE_DIR}/altpatch/include -mcmodel=large
            -fsyntax-only -x c++ ${CMAKE_CURRENT_SOURCE_DIR}/altcall_model.c)
  set_tests_properties(altcall_large_cxx PROPERTIES PASS_REGULAR_EXPRESSION "${ALTPATCH_LARGE_MSG}")
endif()

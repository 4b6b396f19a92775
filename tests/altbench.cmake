# Smoke runs of altbench (tests/test_altbench.c): tiny sizes, no timing asserted.
# The first entry of ALTBENCH_SIZES (default 120) is the generated program used.
if(TARGET altbench AND TARGET test_altbench)
  list(GET ALTBENCH_SIZES 0 _ab_n)
  set(_ab_dir ${CMAKE_BINARY_DIR}/tools/altbench)
  set(_ab_xray "")
  set(_ab_xray_startup "")
  if(ALTBENCH_HAVE_XRAY)
    set(_ab_xray ${_ab_dir}/altbench_xray_${_ab_n})
    set(_ab_xray_startup ${_ab_dir}/altbench_xray_startup_8)
    add_dependencies(test_altbench altbench_xray_${_ab_n}_prog altbench_xray_startup_8_prog)
  endif()
  target_compile_definitions(test_altbench PRIVATE
    ALTBENCH_BIN="$<TARGET_FILE:altbench>"
    ALTBENCH_GEN="$<TARGET_FILE:altbench_gen>"
    ALTBENCH_ALT="$<TARGET_FILE:altbench_alt_${_ab_n}>"
    ALTBENCH_PLAIN="$<TARGET_FILE:altbench_plain_${_ab_n}>"
    ALTBENCH_XRAY="${_ab_xray}"
    ALTBENCH_XRAY_STARTUP="${_ab_xray_startup}"
    ALTBENCH_STARTUP="$<TARGET_FILE:altbench_startup_8>"
    ALTBENCH_N=${_ab_n})
  add_dependencies(test_altbench altbench altbench_gen altbench_alt_${_ab_n}
                   altbench_plain_${_ab_n} altbench_startup_8)
  if(TARGET altdump)
    target_compile_definitions(test_altbench PRIVATE ALTBENCH_ALTDUMP="$<TARGET_FILE:altdump>")
    add_dependencies(test_altbench altdump)
  endif()
endif()

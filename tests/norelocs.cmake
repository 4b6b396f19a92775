# The record tables, replacements and note need no dynamic relocation
# (self-relative offsets): checked on a PIE fixture and a shared library.
foreach(t apfix_O2 apfix_dl)
  if(TARGET ${t})
    add_test(NAME norelocs_${t}
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_norelocs.sh $<TARGET_FILE:${t}>)
  endif()
endforeach()

# test_cancel: threads cancelled while they loop on the library's entry points.
if(TARGET test_cancel)
  target_link_libraries(test_cancel PRIVATE ${CMAKE_DL_LIBS} pthread)
endif()

# Install rules for libaltpatch (include()d by altpatch/CMakeLists.txt).
#
#   include/altpatch/*.h                    public headers
#   lib/libaltpatch.so.X.Y.Z (+ links)      shared library, SOVERSION, version script
#   lib/libaltpatch.a                       static library (needs Zydis at link time)
#   lib/cmake/altpatch/altpatchConfig*.cmake  targets altpatch::altpatch, altpatch::altpatch_static
#   lib/pkgconfig/altpatch.pc               -laltpatch (Libs.private for static linking)
#
# The tests for all this are in tests/install.cmake.
include(CMakePackageConfigHelpers)

set(ALTPATCH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/altpatch)

install(FILES ${ALTPATCH_PUBLIC_HEADERS}
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/altpatch COMPONENT devel)

set_target_properties(altpatch PROPERTIES EXPORT_NAME altpatch)
set_target_properties(altpatch_static PROPERTIES EXPORT_NAME altpatch_static)
install(TARGETS altpatch altpatch_static EXPORT altpatchTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
                NAMELINK_COMPONENT devel
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT altpatchTargets NAMESPACE altpatch::
        DESTINATION ${ALTPATCH_CMAKE_DIR} COMPONENT devel)

configure_package_config_file(
  ${CMAKE_CURRENT_SOURCE_DIR}/altpatchConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/altpatchConfig.cmake
  INSTALL_DESTINATION ${ALTPATCH_CMAKE_DIR})
# 0.x: the SOVERSION is the major number, so the CMake package follows it.
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/altpatchConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/altpatchConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/altpatchConfigVersion.cmake
        DESTINATION ${ALTPATCH_CMAKE_DIR} COMPONENT devel)

# pkg-config: prefix relative to the .pc file, so `cmake --install --prefix`
# and DESTDIR staging both give a correct file.
set(ALTPATCH_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ALTPATCH_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(ALTPATCH_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(ALTPATCH_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH _ap_up /x/${ALTPATCH_PC_DIR} /x)
  string(REGEX REPLACE "/$" "" _ap_up "${_ap_up}")
  set(ALTPATCH_PC_PREFIX "\${pcfiledir}/${_ap_up}")
  set(ALTPATCH_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(ALTPATCH_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/altpatch.pc.in
               ${CMAKE_CURRENT_BINARY_DIR}/altpatch.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/altpatch.pc
        DESTINATION ${ALTPATCH_PC_DIR} COMPONENT devel)

# Man pages, one per call group (docs/man/*.3).
file(GLOB ALTPATCH_MAN3 ${PROJECT_SOURCE_DIR}/docs/man/*.3)
if(ALTPATCH_MAN3)
  install(FILES ${ALTPATCH_MAN3} DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT devel)
endif()

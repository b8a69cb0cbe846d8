# Install rules: headers under include/kiln/, the static libraries (kiln::runtime and what it links),
# libkiln.so (kiln::runtime_shared), the CLI (kiln::cli) and a relocatable kilnConfig.cmake.
include(CMakePackageConfigHelpers)

set(KILN_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/kiln")

foreach(dir jit cache runtime kernel_templates)
  install(DIRECTORY "${dir}/" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/kiln/${dir}" COMPONENT dev
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()

set_target_properties(kiln_jit PROPERTIES EXPORT_NAME jit)
set_target_properties(kiln_cache PROPERTIES EXPORT_NAME cache)
set_target_properties(kiln_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(kiln_shared PROPERTIES EXPORT_NAME runtime_shared)
set_target_properties(kiln PROPERTIES EXPORT_NAME cli)
install(TARGETS kiln_jit kiln_cache kiln_runtime kiln_shared kiln EXPORT kilnTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT dev)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION "${KILN_CMAKE_DIR}" COMPONENT dev)

configure_package_config_file(tools/cmake/kilnConfig.cmake.in "${PROJECT_BINARY_DIR}/kilnConfig.cmake"
                              INSTALL_DESTINATION "${KILN_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/kilnConfig.cmake" "${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake"
        DESTINATION "${KILN_CMAKE_DIR}" COMPONENT dev)

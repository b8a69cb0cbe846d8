# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -P run_consumer.cmake
# Installs the built tree into WORK_DIR/prefix, then builds and runs tests/package/consumer against
# it (find_package: static and shared), and configures it with add_subdirectory(kiln).
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

set(consumer "${SOURCE_DIR}/tests/package/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
foreach(header jit/error.h runtime/tensor_view.h runtime/mla_decode/launcher.h runtime/sparse_nvfp4/launcher.h
               runtime/nvfp4_writer/writer.h)
  if(NOT EXISTS "${WORK_DIR}/prefix/include/kiln/${header}")
    message(FATAL_ERROR "the install tree lacks include/kiln/${header}")
  endif()
endforeach()

# Installed headers reach each other only through the kiln/ prefix (the include root is <prefix>/include).
file(GLOB_RECURSE headers "${WORK_DIR}/prefix/include/kiln/*.h")
foreach(header IN LISTS headers)
  file(STRINGS "${header}" bare REGEX "^#include \"(jit|cache|runtime|kernel_templates)/")
  if(bare)
    message(FATAL_ERROR "${header} includes ${bare}: write #include \"kiln/...\"")
  endif()
endforeach()

run("${CMAKE_COMMAND}" -S "${consumer}" -B "${WORK_DIR}/package" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
    -DKILN_FROM=package "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/package")
run("${WORK_DIR}/package/consumer_static")
run("${WORK_DIR}/package/consumer_shared")

# Configure only: building kiln a second time would double this test's time for no new check.
run("${CMAKE_COMMAND}" -S "${consumer}" -B "${WORK_DIR}/subdirectory" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
    "-DKILN_FROM=${SOURCE_DIR}")

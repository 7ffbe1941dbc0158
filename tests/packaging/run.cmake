# ctest driver for the packaging tests. -DMODE=find_package|add_subdirectory, -DSRC=<kvscout
# source>, -DWORK=<scratch dir>, -DGENERATOR=<generator>.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
if(MODE STREQUAL "find_package")
  # Install kvscout alone (no tests) into a prefix, then build the consumer against it.
  run(${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/kvscout-build -G ${GENERATOR}
      -DCMAKE_INSTALL_PREFIX=${WORK}/prefix -DKVSCOUT_BUILD_TESTS=OFF
      -DKVSCOUT_BUILD_BENCHMARKS=OFF -DKVSCOUT_BUILD_EXAMPLES=OFF -DKVSCOUT_ENABLE_CUDA=OFF)
  run(${CMAKE_COMMAND} --install ${WORK}/kvscout-build)
  if(NOT EXISTS ${WORK}/prefix/include/kvscout/kvscout.hpp)
    message(FATAL_ERROR "install did not place include/kvscout/kvscout.hpp")
  endif()
  run(${CMAKE_COMMAND} -S ${SRC}/tests/packaging/find_package -B ${WORK}/consumer -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${WORK}/prefix)
else()
  run(${CMAKE_COMMAND} -S ${SRC}/tests/packaging/add_subdirectory -B ${WORK}/consumer
      -G ${GENERATOR} -DKVSCOUT_SOURCE_DIR=${SRC})
endif()
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/consumer)

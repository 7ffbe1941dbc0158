# Helpers for kvscout's own tests, benchmarks and examples (not installed).

# Warnings for host code we own.
function(kvscout_host_target target)
  target_link_libraries(${target} PRIVATE kvscout::kvscout)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
endfunction()

# kvscout_sanitized(target [PUBLIC|INTERFACE] [OPT flags...]): with KVSCOUT_SANITIZE set
# (scripts/test.sh: address,undefined), `target` (PUBLIC: and what links it; INTERFACE: only what
# links it) is compiled under those sanitizers with assertions on, whatever the
# build type, at KVSCOUT_SANITIZE_OPT (-O0 -g1) or the OPT flags given; its options come after the
# build type's, so they win. Without KVSCOUT_SANITIZE, nothing changes.
# With NO_OPT, no optimisation flags at all: each target built on `target` sets its own.
function(kvscout_sanitized target)
  if(KVSCOUT_SANITIZE)
    cmake_parse_arguments(_s "PUBLIC;INTERFACE;NO_OPT" "" "OPT" ${ARGN})
    set(_scope PRIVATE)
    if(_s_PUBLIC)
      set(_scope PUBLIC)
    elseif(_s_INTERFACE)
      set(_scope INTERFACE)
    endif()
    set(_opt ${KVSCOUT_SANITIZE_OPT})
    if(_s_OPT)
      set(_opt ${_s_OPT})
    elseif(_s_NO_OPT)
      set(_opt)
    endif()
    target_compile_options(${target} ${_scope} -fsanitize=${KVSCOUT_SANITIZE}
                           -fno-omit-frame-pointer -fno-sanitize-recover=all
                           ${_opt} -UNDEBUG)
    if(KVSCOUT_SANITIZE MATCHES "undefined" AND KVSCOUT_SANITIZE_EXCLUDE)
      # Each of these doubled UBSan's compile time or more for little: ASan already stops on a
      # null or out-of-object access and on a wrapped pointer that is dereferenced.
      target_compile_options(${target} ${_scope} -fno-sanitize=${KVSCOUT_SANITIZE_EXCLUDE})
    endif()
    target_link_options(${target} ${_scope} -fsanitize=${KVSCOUT_SANITIZE})
    # Test executables are linked position-dependent: an instrumented test binary of 130 MB
    # started in 0.072 s as a PIE (its relocations written at every start) and in 0.046 s without,
    # and ctest starts one process per test case (about a thousand).
    target_link_options(${target} ${_scope}
                        $<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:-no-pie>)
  endif()
endfunction()

# kvscout_test_target(target [RUN_BOUND]): a host test (executable or objects): warnings, and the
# sanitizers when KVSCOUT_SANITIZE is set, at KVSCOUT_SANITIZE_OPT (-O0 -g1: most tests' time is
# their compile), or with RUN_BOUND at KVSCOUT_SANITIZE_OPT_RUN (-O1 -g1: tests whose time is their
# run; docs/testing.md has the measurement). Only tests go through here: benchmarks, the demo,
# the harness and the CUDA objects stay uninstrumented in the same tree.
function(kvscout_test_target target)
  kvscout_host_target(${target})
  if("RUN_BOUND" IN_LIST ARGN)
    kvscout_sanitized(${target} OPT ${KVSCOUT_SANITIZE_OPT_RUN})
  else()
    kvscout_sanitized(${target})
  endif()
endfunction()

# CUDA targets compile for CMAKE_CUDA_ARCHITECTURES (90 unless overridden).
function(kvscout_cuda_target target)
  # cuBLAS: the decode-step benchmark's model (bench/cuda/decode_step.cuh) and its test.
  target_link_libraries(${target} PRIVATE kvscout::kvscout CUDA::cudart CUDA::cublas)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>)
  # nvcc 13 with CMake 3.25 has no CUDA20 dialect entry: pass the standard directly.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endfunction()

# kvscout_cuda_program(target sources...): a GPU test, benchmark or example. Normally an
# executable for CMAKE_CUDA_ARCHITECTURES. With KVSCOUT_CUDA_DEVICE_CODE_ONLY (scripts/nvcc_check.sh
# sets it: without a GPU these programs could only skip) it is device code only:
# one nvcc run per source (--fatbin: the front end, cicc and ptxas for sm_80 and every
# architecture of CMAKE_CUDA_ARCHITECTURES, no host compile, no link), about 45 % of the
# executable's and the sm_80 check's nvcc time (docs/testing.md). The host side of the same
# sources is compiled by g++ for the SIMT emulator (tests/simt), which runs it.
function(kvscout_cuda_program target)
  if(KVSCOUT_CUDA_DEVICE_CODE_ONLY)
    add_library(${target} OBJECT ${ARGN})
    kvscout_cuda_target(${target})
    set(_archs 80-real)
    foreach(a IN LISTS CMAKE_CUDA_ARCHITECTURES)
      if(NOT a MATCHES "^[0-9]+[a-z]?(-real|-virtual)?$")
        message(FATAL_ERROR "KVSCOUT_CUDA_DEVICE_CODE_ONLY needs numbered CMAKE_CUDA_ARCHITECTURES "
                            "(e.g. 90), got '${a}'")
      endif()
      string(REGEX REPLACE "-(real|virtual)$" "" a "${a}")
      list(APPEND _archs ${a}-real)
    endforeach()
    list(REMOVE_DUPLICATES _archs)
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${_archs}")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fatbin>)
  else()
    add_executable(${target} ${ARGN})
    kvscout_cuda_target(${target})
  endif()
endfunction()

# kvscout_cuda_test(name target [args...]): registers a GPU test (label gpu; exit code 77 =
# skipped where no device is present). Under KVSCOUT_CUDA_DEVICE_CODE_ONLY there is no program
# to run: the test is registered DISABLED, so ctest lists it as not run.
function(kvscout_cuda_test name target)
  if(KVSCOUT_CUDA_DEVICE_CODE_ONLY)
    add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -E false)
    set_tests_properties(${name} PROPERTIES LABELS gpu DISABLED TRUE)
  else()
    add_test(NAME ${name} COMMAND ${target} ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
  endif()
endfunction()

# kvscout_all_in_one(out headers...): writes `out`, one file that includes every header given, so
# that two headers defining the same name fail to compile together (tests/, tests/cuda/ and
# tests/simt/; here, not in tests/CMakeLists.txt, because the GPU-only tree reads tests/cuda/
# alone).
function(kvscout_all_in_one out)
  set(_text "")
  foreach(h IN LISTS ARGN)
    string(APPEND _text "#include \"${h}\"\n")
  endforeach()
  file(GENERATE OUTPUT ${out} CONTENT "${_text}")
endfunction()

# Helpers for kvscout's own tests, benchmarks and examples (not installed).

# Warnings for host code we own.
function(kvscout_host_target target)
  target_link_libraries(${target} PRIVATE kvscout::kvscout)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
endfunction()

# kvscout_sanitized(target [PUBLIC]): with KVSCOUT_SANITIZE set (scripts/test.sh: address,undefined),
# `target` is compiled under those sanitizers at KVSCOUT_SANITIZE_OPT (-O1 -g1: fast enough to run
# every host test once, with line numbers in the reports) with assertions on, whatever the build
# type; its options come after the build type's, so they win. Without it, nothing changes.
function(kvscout_sanitized target)
  if(KVSCOUT_SANITIZE)
    set(_scope PRIVATE)
    if(ARGC GREATER 1)
      set(_scope ${ARGV1})
    endif()
    target_compile_options(${target} ${_scope} -fsanitize=${KVSCOUT_SANITIZE}
                           -fno-omit-frame-pointer -fno-sanitize-recover=all
                           ${KVSCOUT_SANITIZE_OPT} -UNDEBUG)
    if(KVSCOUT_SANITIZE MATCHES "undefined" AND KVSCOUT_SANITIZE_EXCLUDE)
      # Each of these doubled UBSan's compile time or more for little: ASan already stops on a
      # null or out-of-object access and on a wrapped pointer that is dereferenced.
      target_compile_options(${target} ${_scope} -fno-sanitize=${KVSCOUT_SANITIZE_EXCLUDE})
    endif()
    target_link_options(${target} ${_scope} -fsanitize=${KVSCOUT_SANITIZE})
  endif()
endfunction()

# A host test (executable or objects): warnings, and the sanitizers when KVSCOUT_SANITIZE is set.
# Only tests go through here: benchmarks, the demo, the harness and the CUDA objects stay
# optimised and uninstrumented in the same tree.
function(kvscout_test_target target)
  kvscout_host_target(${target})
  kvscout_sanitized(${target})
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

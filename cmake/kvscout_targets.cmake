# Helpers for kvscout's own tests, benchmarks and examples (not installed).

# Warnings for host code we own.
function(kvscout_host_target target)
  target_link_libraries(${target} PRIVATE kvscout::kvscout)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
  if(KVSCOUT_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${KVSCOUT_SANITIZE}
                           -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${KVSCOUT_SANITIZE})
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

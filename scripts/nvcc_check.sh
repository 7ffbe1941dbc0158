#!/usr/bin/env bash
# Compiles every CUDA source with nvcc on a machine without a GPU (CI runs it; scripts/test.sh
# leaves nvcc out where no GPU is visible, since nothing it compiles could run there):
#   - build-nvcc/ (KVSCOUT_GPU_ONLY, KVSCOUT_CUDA_DEVICE_CODE_ONLY): the device code of every GPU
#     test, GPU benchmark and the CUDA example for sm_80 and CMAKE_CUDA_ARCHITECTURES (90), one
#     nvcc run each (the front end, cicc and ptxas, no host compile), and the nvcc header checks
#     (each .cuh alone, every header in one unit, host and device);
#   - build-gpu-only/ (what scripts/gpu_check.sh configures): one GPU test and one GPU benchmark
#     compiled and linked in full, so the host side under nvcc and the link are checked too.
# The host side of every GPU source is compiled by g++ and run on the SIMT emulator in the test
# build (tests/simt). Exits non-zero on any compile error.
#
#   bash scripts/nvcc_check.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
if ! command -v nvcc >/dev/null; then
  # CI must check the CUDA sources: there, no nvcc is a failure.
  echo "kvscout: no nvcc: nothing checked" >&2
  [[ -z "${CI:-}" ]] || exit 1
  exit 0
fi
kvscout_install_deps cmake ninja-build g++ libbenchmark-dev
jobs=$(kvscout_jobs)
cmake -S "$root" -B "$root/build-nvcc" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CUDA_FLAGS_RELEASE=-O2 -DNDEBUG" -DKVSCOUT_GPU_ONLY=ON \
  -DKVSCOUT_CUDA_DEVICE_CODE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$root/build-nvcc" -j "$jobs"
cmake -S "$root" -B "$root/build-gpu-only" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVSCOUT_GPU_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$root/build-gpu-only" -j "$jobs" --target kvscout_gpu_test_core_device \
  kvscout_gpu_bench_attention
echo "kvscout: nvcc compiled every CUDA source (device code for sm_80 and sm_90) and linked two"

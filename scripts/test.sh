#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every test kvscout has:
#   1. the main build (host tests, compile-fail tests, packaging tests, examples; CUDA targets
#      compiled for sm_90 when nvcc exists, GPU tests skipped without a device),
#   2. the host tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Exits non-zero on any failure.
#
#   bash scripts/test.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++ python3 catch2 libbenchmark-dev libeigen3-dev
jobs=$(kvscout_jobs)

echo "== kvscout: main build (build/)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$root/build" -j "$jobs"
(cd "$root/build" && ctest -j "$jobs" --output-on-failure)

echo "== kvscout: host tests under address,undefined sanitizers (build-asan/)"
cmake -S "$root" -B "$root/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DKVSCOUT_SANITIZE=address,undefined -DKVSCOUT_ENABLE_CUDA=OFF -DKVSCOUT_BUILD_BENCHMARKS=OFF
cmake --build "$root/build-asan" -j "$jobs" --target kvscout_host_tests kvscout_readme_example 00_host_gather
(cd "$root/build-asan" && ctest -j "$jobs" --output-on-failure -L host -LE compile_fail)

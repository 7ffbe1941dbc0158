#!/usr/bin/env bash
# ThreadSanitizer over the host tests that start threads (kvscout::thread_pool: the host gather,
# attention split over the pool, the host pipeline, KIVI rows gathered by 2 threads). Builds
# build-tsan/ (KVSCOUT_SANITIZE=thread, -O1) with that one test executable and runs every test
# case in it; a data race fails the run (halt_on_error) with both stacks printed.
#
#   bash scripts/tsan.sh
set -euo pipefail
SECONDS=0
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++ catch2 libeigen3-dev
cmake -S "$root" -B "$root/build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" -DKVSCOUT_SANITIZE=thread -DKVSCOUT_ENABLE_CUDA=OFF \
  -DKVSCOUT_BUILD_BENCHMARKS=OFF -DKVSCOUT_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$root/build-tsan" -j "$(kvscout_jobs)" --target kvscout_thread_tests
echo "== kvscout: tsan build took $SECONDS s"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  "$root/build-tsan/tests/kvscout_thread_tests"
echo "== kvscout: tsan done in $SECONDS s"

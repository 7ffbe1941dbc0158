#!/usr/bin/env bash
# Sets up a fresh Debian machine, builds and runs kvscout's main demo.
# Today the demo is examples/00_host_gather (a paged fp16 cache, 10 % of the rows selected and
# gathered, every row checked); the real-model demo (SmolLM2 with speculation) will replace it.
#
#   bash scripts/demo.sh [--threads N] [--density PERCENT]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++
cmake -S "$root" -B "$root/build-demo" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVSCOUT_BUILD_TESTS=OFF -DKVSCOUT_BUILD_BENCHMARKS=OFF -DKVSCOUT_ENABLE_CUDA=OFF >/dev/null
cmake --build "$root/build-demo" --target 00_host_gather >/dev/null
"$root/build-demo/examples/00_host_gather" "$@"

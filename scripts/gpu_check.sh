#!/usr/bin/env bash
# Builds and runs every GPU test (ctest label `gpu`) on a machine with a CUDA device, nvcc and
# cmake, without Debian's packages (the GPU harness is self-contained), and ends with a results
# table. Target: under 8 minutes.
#
#   bash scripts/gpu_check.sh            # sm_90 (H100 / H200); CMAKE_CUDA_ARCHITECTURES overrides
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
build=${KVSCOUT_GPU_BUILD:-$root/build-gpu}
arch=${CMAKE_CUDA_ARCHITECTURES:-90}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
start=$(date +%s)

cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVSCOUT_GPU_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" || exit 1
cmake --build "$build" -j "$(kvscout_jobs)" || exit 1

log="$build/gpu_tests.log"
(cd "$build" && ctest -L gpu --output-on-failure) | tee "$log"
rc=${PIPESTATUS[0]}

echo
echo "## kvscout GPU check, $(date -u +%Y-%m-%d)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
echo
echo "| test | result |"
echo "|:--|:--|"
grep -E "^ *[0-9]+/[0-9]+ Test +#[0-9]+: " "$log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) [ .*]*(Passed|\*\*\*Failed|\*\*\*Skipped|Skipped|Not Run|\*\*\*Exception.*)?.*/| \1 | \2 |/'
echo
echo "elapsed: $(( $(date +%s) - start )) s"
exit "$rc"

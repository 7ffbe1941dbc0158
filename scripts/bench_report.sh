#!/usr/bin/env bash
# Builds the host benchmarks (Release, -march=native), runs them, and prints the tables with the
# ratio of each measurement to its anchor from the same run. The last lines are one per target:
#   <target-name> <measured> <goal> <met|missed>
#
#   bash scripts/bench_report.sh                          # full run (a few minutes on 2 cores)
#   KVSCOUT_BENCH_QUICK=1 bash scripts/bench_report.sh    # one repetition, shorter runs, small sizes
#   KVSCOUT_BENCH_MD=out.md bash scripts/bench_report.sh  # also write the tables as markdown
#   KVSCOUT_BENCH_BUILD=build bash scripts/bench_report.sh
#       # an existing build tree, used as it is configured (CI: the test build's benchmarks)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVSCOUT_BENCH_BUILD:-$root/build-bench}
out=${KVSCOUT_BENCH_OUT:-$build/results}
mkdir -p "$out"

if [[ -z "${KVSCOUT_BENCH_BUILD:-}" || ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSCOUT_BUILD_TESTS=OFF \
    -DKVSCOUT_BUILD_EXAMPLES=OFF -DKVSCOUT_ENABLE_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target kvscout_bench_gather kvscout_bench_select kvscout_bench_speculation \
  kvscout_bench_kivi >/dev/null

# Repetitions run in random order across a binary's benchmarks: the VMs this runs on change
# speed over seconds (an L2-resident 4k stream read measured 4.0 to 6.6 us within minutes,
# 2026-12-04), and a benchmark and its anchor measured minutes apart would carry that into their
# ratio; interleaved, both medians come from the same stretch of time.
reps=3 min_time=0.2 filter=()
# Quick (CI: do the benchmarks and the report still run): the smallest size of each family only,
# which skips most of the set-up time (caches of 32k and 128k tokens built per benchmark).
if [[ -n "${KVSCOUT_BENCH_QUICK:-}" ]]; then reps=1 min_time=0.05 filter=(--benchmark_filter='-n:(32768|131072)'); fi

for b in gather select speculation kivi; do
  echo "== kvscout_bench_$b (${reps} repetitions, median)" >&2
  "$build/bench/kvscout_bench_$b" --benchmark_repetitions=$reps --benchmark_min_time=$min_time \
    --benchmark_enable_random_interleaving=true "${filter[@]}" \
    --benchmark_out="$out/host_$b.json" --benchmark_out_format=json >"$out/host_$b.txt"
done

args=("$out")
if [[ -n "${KVSCOUT_BENCH_MD:-}" ]]; then args+=(--markdown "$KVSCOUT_BENCH_MD"); fi
python3 "$root/scripts/bench_table.py" "${args[@]}"

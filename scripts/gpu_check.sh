#!/usr/bin/env bash
# Builds and runs every GPU test (ctest label `gpu`) and every GPU benchmark on a machine with a
# CUDA device, nvcc and cmake but none of Debian's packages, and ends with a results table.
# Target: under 8 minutes on one H100 / H200 with 16 cores.
#
#   bash scripts/fetch_gpu_deps.sh      # here, once: Google Benchmark's source into third_party/
#   bash scripts/gpu_check.sh           # there: sm_90 (CMAKE_CUDA_ARCHITECTURES overrides)
#
# Google Benchmark: the system's if CMake finds one, else built from third_party/ (carried with
# the tree; third_party/ is git-ignored, so carry it explicitly). Without either, the tests still
# run and the benchmarks are skipped (said in the table).
# Output: build-gpu/gpu_tests.log, build-gpu/bench/*.json (benchmarks; anchors.json: PyTorch at
# the same shapes, where python3 has torch), build-gpu/bench/ncu.csv (one Nsight Compute pass,
# where ncu works; KVSCOUT_NCU=0 skips it), and the tables on stdout (also build-gpu/gpu_check.md),
# ending with the goal lines (scripts/gpu_goals.py).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
build=${KVSCOUT_GPU_BUILD:-$root/build-gpu}
arch=${CMAKE_CUDA_ARCHITECTURES:-90}
min_time=${KVSCOUT_BENCH_MIN_TIME:-0.1}
jobs=$(kvscout_jobs)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
start=$(date +%s)
mkdir -p "$build"

# ---- Google Benchmark ---------------------------------------------------------------------------
bench_args=()
tarball=$(ls "$root"/third_party/benchmark_*.orig.tar.gz 2>/dev/null | head -1)
have_system_benchmark=0
for d in /usr/include /usr/local/include; do
  [[ -f $d/benchmark/benchmark.h ]] && have_system_benchmark=1
done
# KVSCOUT_BUILD_BENCHMARK=1 builds from third_party/ even where the system has one.
if [[ -n "$tarball" && ( $have_system_benchmark == 0 || ${KVSCOUT_BUILD_BENCHMARK:-0} == 1 ) ]]; then
  prefix="$build/_deps/benchmark-install"
  if [[ ! -f "$prefix/lib/cmake/benchmark/benchmarkConfig.cmake" ]]; then
    echo "== building Google Benchmark from $(basename "$tarball")"
    rm -rf "$build/_deps/benchmark-src" && mkdir -p "$build/_deps/benchmark-src"
    tar xzf "$tarball" -C "$build/_deps/benchmark-src" --strip-components=1
    cmake -S "$build/_deps/benchmark-src" -B "$build/_deps/benchmark-build" "${gen[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
      -DBENCHMARK_ENABLE_TESTING=OFF -DBENCHMARK_ENABLE_GTEST_TESTS=OFF \
      -DBENCHMARK_ENABLE_WERROR=OFF -DBENCHMARK_ENABLE_INSTALL=ON >/dev/null &&
      cmake --build "$build/_deps/benchmark-build" -j "$jobs" >/dev/null &&
      cmake --install "$build/_deps/benchmark-build" >/dev/null ||
      echo "kvscout: could not build Google Benchmark; GPU benchmarks will be skipped" >&2
  fi
  [[ -f "$prefix/lib/cmake/benchmark/benchmarkConfig.cmake" ]] &&
    bench_args=(-Dbenchmark_DIR="$prefix/lib/cmake/benchmark")
fi

# ---- build ----------------------------------------------------------------------------------------
echo "== configure + build (sm_$arch, $jobs jobs)"
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVSCOUT_GPU_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" "${bench_args[@]}" >/dev/null || exit 1
cmake --build "$build" -j "$jobs" || exit 1
built=$(date +%s)
echo "build: $(( built - start )) s"

# ---- tests ----------------------------------------------------------------------------------------
log="$build/gpu_tests.log"
(cd "$build" && ctest -L gpu --output-on-failure --timeout "${KVSCOUT_TEST_TIMEOUT:-120}") | tee "$log"
rc=${PIPESTATUS[0]}
tested=$(date +%s)

# ---- benchmarks -----------------------------------------------------------------------------------
mkdir -p "$build/bench"
limit=()
command -v timeout >/dev/null && limit=(timeout "${KVSCOUT_BENCH_TIMEOUT:-180}")
rm -f "$build"/bench/*.json
for exe in "$build"/bench/cuda/kvscout_gpu_bench_*; do
  [[ -x "$exe" ]] || continue
  name=$(basename "$exe")
  echo "== $name"
  # A hung binary must not eat the session: each gets KVSCOUT_BENCH_TIMEOUT seconds; a JSON cut
  # short by a crash or the timeout is still tabulated up to where it stopped (gpu_table.py).
  # The decode-step benchmark builds 8-layer Llama-shaped stacks up to 128k x 8 tokens: more time.
  run_limit=("${limit[@]}")
  [[ ${#limit[@]} -gt 0 && $name == *decode_step* ]] && run_limit=(timeout "${KVSCOUT_DECODE_STEP_TIMEOUT:-360}")
  "${run_limit[@]}" "$exe" --benchmark_min_time="$min_time" \
    --benchmark_out="$build/bench/$name.json" --benchmark_out_format=json || rc=1
done
benched=$(date +%s)

# ---- PyTorch anchors (where python3 has torch) and one Nsight Compute pass (where ncu works) -------
anchors="$build/bench/anchors.json"
rm -f "$anchors"
"${limit[@]}" python3 "$root/scripts/gpu_anchors.py" "$anchors" || echo "kvscout: gpu_anchors.py failed" >&2
ncu_md="$build/bench/ncu.md"
rm -f "$ncu_md"
if command -v ncu >/dev/null && [[ ${KVSCOUT_NCU:-1} == 1 ]]; then
  # Every kvscout kernel of one decode step at 32k tokens (attention over 10 % of 32k, spec and
  # selection at 32768, the gather at 10 % of 16k): grid, block, registers, time, DRAM
  # throughput, achieved occupancy. One iteration each (min_time 0), clocks not locked.
  metrics=launch__grid_size,launch__block_size,launch__registers_per_thread,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
  : > "$build/bench/ncu.csv"
  for spec in "kvscout_gpu_bench_attention:tokens:32768/density_pct:10/kind:(0|3)/" \
              "kvscout_gpu_bench_spec_select:^(spec|topk|threshold)/32768" \
              "kvscout_gpu_bench_fetch_attention:bm_zero_copy<kvscout::half>/density_pct:10/blocks:0/"; do
    exe="$build/bench/cuda/${spec%%:*}"
    [[ -x $exe ]] || continue
    "${limit[@]}" ncu --clock-control none --csv --page raw --metrics "$metrics" \
      --kernel-name-base demangled --kernel-name regex:kvscout --launch-count 40 \
      "$exe" --benchmark_filter="${spec#*:}" --benchmark_min_time=0 \
      >> "$build/bench/ncu.csv" 2>/dev/null || echo "kvscout: ncu on ${spec%%:*} failed" >&2
  done
  python3 "$root/scripts/gpu_ncu_table.py" "$build/bench/ncu.csv" > "$ncu_md" 2>/dev/null ||
    echo "(ncu: no kernel rows)" > "$ncu_md"
fi

# ---- table ----------------------------------------------------------------------------------------
{
  echo
  echo "## kvscout GPU check, $(date -u +%Y-%m-%d)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/device: /'
  echo "nvcc: $(nvcc --version | tail -1)"
  echo
  echo "| test | result | time |"
  echo "|:--|:--|--:|"
  grep -E "^ *[0-9]+/[0-9]+ Test +#[0-9]+: " "$log" |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) [.]*(.*[^ ]) +([0-9.]+ sec)$/| \1 | \2 | \3 |/; s/\*\*\*/ /g; s/\| +/| /g'
  echo
  python3 "$root/scripts/gpu_table.py" $(ls "$build"/bench/*.json 2>/dev/null | grep -v anchors.json) 2>/dev/null ||
    echo "(no GPU benchmark results: Google Benchmark missing or no benchmark ran)"
  echo
  if [[ -f $ncu_md ]]; then
    echo "### Nsight Compute, one pass at 32k tokens"
    echo
    cat "$ncu_md"
    echo
  fi
  echo "### Goals (ratios of this run; PyTorch anchors from scripts/gpu_anchors.py)"
  echo
  python3 "$root/scripts/gpu_goals.py" "$anchors" "$build"/bench/kvscout_gpu_bench_*.json
  echo
  echo "elapsed: $(( $(date +%s) - start )) s (build $(( built - start )), tests $(( tested - built )), benchmarks $(( benched - tested )))"
} | tee "$build/gpu_check.md"
exit "$rc"

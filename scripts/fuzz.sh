#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (address + undefined sanitizers) and runs
# each for a bounded time from its seed corpus (tests/fuzz/corpus/<target>/, read only: new inputs
# go to a temporary corpus that is deleted afterwards). Prints one summary line per target and,
# for every crash, hang (timeout), leak or out-of-memory input found, the target, the artifact's
# path (build-fuzz/artifacts/<target>/, emptied when the target's run starts) and its bytes;
# exits non-zero if any was found.
#
#   bash scripts/fuzz.sh [seconds_per_target (default 60)] [target...]
#   bash scripts/fuzz.sh 30 gguf tokenizer
#   build-fuzz/fuzz_gguf build-fuzz/artifacts/gguf/crash-...     # replay one input
#
# Targets: gguf tokenizer prompt_jsonl layout_metadata (tests/fuzz/fuzz_<target>.cpp). Builds go
# to build-fuzz/ (a target is rebuilt only when its source, a header it includes or the compile
# command changed);
# CXX picks the compiler (default clang++); KVSCOUT_FUZZ_JOBS how many build / run at once
# (default nproc). Extra libFuzzer flags can be given in KVSCOUT_FUZZ_FLAGS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"

all_targets=(gguf tokenizer prompt_jsonl layout_metadata)
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || {
  echo "usage: bash scripts/fuzz.sh [seconds_per_target] [target...]" >&2
  exit 2
}
shift $(($# > 0 ? 1 : 0))
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ -f $root/tests/fuzz/fuzz_$t.cpp ]] || {
    echo "kvscout fuzz: no target '$t' (known: ${all_targets[*]})" >&2
    exit 2
  }
done

CXX=${CXX:-clang++}
if ! command -v "$CXX" >/dev/null ||
  ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  kvscout_install_deps clang libclang-rt-14-dev
fi
jobs=${KVSCOUT_FUZZ_JOBS:-$(kvscout_jobs)}
out=$root/build-fuzz
mkdir -p "$out"
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include  # cuda_fp16.h etc. (kvscout/core/dtype.hpp)
# shellcheck disable=SC2054  # the commas are part of -fsanitize=...
# _GLIBCXX_ASSERTIONS: libstdc++'s bounds checks (operator[] of vector, string_view, ...) abort.
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
  -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS -Wall -Wextra
  -I"$root/include" -I"$root/tools" -isystem "$cuda_inc")

# ---- build: each target from its one source file; skipped when the binary is newer than the
# source and every header its dependency file lists --------------------------------------------
up_to_date() {
  local bin=$1 dep=$1.d f
  [[ -x $bin && -f $dep && -f $bin.cmd && $(<"$bin.cmd") == "$CXX ${flags[*]}" ]] || return 1
  for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep"); do
    [[ -e $f && ! $f -nt $bin ]] || return 1
  done
}
build() {
  local t=$1 bin=$out/fuzz_$1 start=$SECONDS
  if up_to_date "$bin"; then
    echo "kvscout fuzz: $t up to date"
    return 0
  fi
  if ! "$CXX" "${flags[@]}" -MMD -MF "$bin.d" -o "$bin.tmp" "$root/tests/fuzz/fuzz_$t.cpp" \
    >"$out/build_$t.log" 2>&1; then
    echo "kvscout fuzz: building $t failed:" >&2
    cat "$out/build_$t.log" >&2
    return 1
  fi
  mv "$bin.tmp" "$bin"
  echo "$CXX ${flags[*]}" >"$bin.cmd"
  echo "kvscout fuzz: built $t in $((SECONDS - start)) s"
}
SECONDS=0
pids=()
failed=0
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || failed=1; done
  build "$t" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
((failed == 0)) || exit 1
echo "kvscout fuzz: build took $SECONDS s"

# ---- run: nproc targets at a time, each from a temporary copy-on-write corpus ---------------------
work=$(mktemp -d "$out/run.XXXXXX")
trap 'rm -rf "$work"' EXIT
run() {
  local t=$1 seeds=$root/tests/fuzz/corpus/$1 art=$out/artifacts/$1
  rm -rf "$art"
  mkdir -p "$art" "$work/$t"
  [[ -d $seeds ]] || seeds=""
  # New inputs go to the first directory (temporary); the seeds are only read.
  # shellcheck disable=SC2086
  # Slow inputs (the tokenizer's long texts) are picked less often for mutation.
  "$out/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -entropic_scale_per_exec_time=1 -print_final_stats=1 -artifact_prefix="$art/" \
    ${KVSCOUT_FUZZ_FLAGS:-} \
    "$work/$t" $seeds >"$out/run_$t.log" 2>&1
}
SECONDS=0
declare -A rc
pids=()
names=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run "$t" &
  pids+=($!)
  names+=("$t")
done
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then rc[${names[$i]}]=0; else rc[${names[$i]}]=$?; fi
done
echo "kvscout fuzz: ran ${#targets[@]} target(s), ${seconds} s each, in $SECONDS s"

# ---- report -------------------------------------------------------------------------------------
bad=0
for t in "${targets[@]}"; do
  log=$out/run_$t.log
  art=$out/artifacts/$t
  stat_of() { sed -n "s/^stat::$1: *//p" "$log" | tail -n 1; }
  runs=$(stat_of number_of_executed_units)
  speed=$(stat_of average_exec_per_sec)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  found=()
  for f in "$art"/crash-* "$art"/timeout-* "$art"/leak-* "$art"/oom-*; do
    [[ -e $f ]] && found+=("$f")
  done
  result=ok
  if ((${#found[@]})); then
    result=$(basename "${found[0]}" | cut -d- -f1)
  elif ((rc[$t] != 0)); then
    result="failed (exit ${rc[$t]})"
  fi
  printf 'kvscout fuzz: %-16s runs %-9s exec/s %-7s cov %-6s ft %-6s corpus %-10s %s\n' "$t" \
    "${runs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  if [[ $result != ok ]]; then
    bad=1
    echo "---- $t: $result; log $log"
    grep -E 'ERROR|FUZZ FINDING|SUMMARY|deadly signal|ALARM|Test unit written|runtime error' \
      "$log" | head -n 20 || true
    for f in "${found[@]}"; do
      echo "---- $t artifact: $f ($(wc -c <"$f") bytes); replay: $out/fuzz_$t $f"
      if command -v xxd >/dev/null; then xxd "$f"; else od -A x -t x1z "$f"; fi | head -c 4000
      echo
    done
    ((${#found[@]})) || tail -n 30 "$log"
  fi
done
exit $bad

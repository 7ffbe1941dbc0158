#!/usr/bin/env bash
# The accuracy harness (issue 6): teacher-forced perplexity of SmolLM2-135M-Instruct when its
# attention reads only what a speculation policy selected, over policies x budgets x KV formats,
# with per-layer attention-mass recall and overlap with the oracle (tools/accuracy/accuracy.cpp).
# Fetches the model, builds kvscout_accuracy (-O3 -march=native, build-accuracy/), runs the whole
# harness on one core (about 35 minutes), writes
#   docs/accuracy.csv          one row per configuration (columns: docs/accuracy_log.md, "Metrics")
#   docs/accuracy_layers.csv   one row per configuration and layer
#   docs/img/accuracy_*.png    perplexity against bytes fetched per step, per-layer recall
# (docs/ is the default of --out DIR; the plots go to DIR/img).
# and keeps the log in build-accuracy/accuracy.log. Extra arguments go to the harness
# (e.g. --quick for a smoke run of a few minutes; --out DIR to write everything elsewhere).
#
#   bash scripts/accuracy.sh [--quick] [--formats fp16,kivi4,kivi2]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++ python3 python3-pip libeigen3-dev
model=$(bash "$root/scripts/fetch_model.sh" | tail -n 1)

long=${KVSCOUT_ACCURACY_LONG:-/usr/share/common-licenses/GPL-3}  # Debian's base-files
short=${KVSCOUT_ACCURACY_SHORT:-${KVSCOUT_DATA_DIR:-$root/tests/data}/pg19_firstbook.txt}
out="$root/docs"
for ((i = 1; i <= $#; ++i)); do
  [[ "${!i}" == "--out" ]] && { j=$((i + 1)); out="${!j}"; }
done
short_args=()
[[ -f "$short" ]] && short_args=(--short "$short")

echo "== building the accuracy harness (build-accuracy/)" >&2
cmake -S "$root" -B "$root/build-accuracy" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVSCOUT_BUILD_TESTS=OFF -DKVSCOUT_BUILD_BENCHMARKS=OFF -DKVSCOUT_BUILD_EXAMPLES=OFF \
  -DKVSCOUT_ENABLE_CUDA=OFF >/dev/null
cmake --build "$root/build-accuracy" --target kvscout_accuracy >/dev/null

mkdir -p "$out/img"
echo "== running the harness (log: build-accuracy/accuracy.log)" >&2
"$root/build-accuracy/tools/kvscout_accuracy" --model "$model" --long "$long" "${short_args[@]}" \
  --out "$out" "$@" 2>&1 | tee "$root/build-accuracy/accuracy.log"

echo "== plots" >&2
python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install -q matplotlib
python3 "$root/scripts/plot_accuracy.py" --csv "$out/accuracy.csv" --layers "$out/accuracy_layers.csv" \
  --out "$out/img"

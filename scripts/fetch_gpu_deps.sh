#!/usr/bin/env bash
# Fetches what scripts/gpu_check.sh needs on a GPU machine that has nvcc and cmake but none of
# Debian's packages: the source of Google Benchmark 1.7.1 (the version Debian 12 ships), from
# Debian's archive, checked against its sha256, into third_party/ (git-ignored). Run it here, then
# carry third_party/ to the GPU machine with the tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/third_party"
tarball="$dest/benchmark_1.7.1.orig.tar.gz"
sha=6430e4092653380d9dc4ccb45a1e2dc9259d581f4866dc0759713126056bc1d7
mkdir -p "$dest"
if [[ ! -f "$tarball" ]] || ! echo "$sha  $tarball" | sha256sum -c --status; then
  curl -sSfL -o "$tarball.part" \
    http://deb.debian.org/debian/pool/main/b/benchmark/benchmark_1.7.1.orig.tar.gz
  echo "$sha  $tarball.part" | sha256sum -c --status || {
    echo "kvscout: sha256 mismatch for the Google Benchmark source" >&2
    exit 1
  }
  mv "$tarball.part" "$tarball"
fi
echo "$tarball"

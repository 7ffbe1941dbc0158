#!/usr/bin/env bash
# Fetches what scripts/gpu_check.sh needs on a GPU machine that has nvcc and cmake but none of
# Debian's packages: the upstream source of Google Benchmark 1.7.1 (the version Debian 12 ships),
# as the orig tarball of Debian's `benchmark` source package, checked against its sha256, into
# third_party/benchmark_1.7.1.orig.tar.gz (git-ignored). Run it here (a Debian machine whose apt
# works), then carry third_party/ to the GPU machine with the tree.
#
# It goes through apt, with no address of its own: the `deb` entries of this machine's apt
# sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list, and the deb822
# /etc/apt/sources.list.d/*.sources) are rewritten as `deb-src` entries (same URIs, suites,
# components and signing keys) into a temporary sources file, and apt-get runs on that file alone,
# with its lists and caches in a temporary directory (the machine's own apt state is not touched):
#   apt-get update; apt-cache showsrc benchmark; apt-get source --download-only benchmark=VERSION
#
# Fallback order:
#   1. third_party/benchmark_1.7.1.orig.tar.gz already there with the right sha256: nothing to do.
#   2. source version 1.7.1-1 (Debian 12's), when the sources serve it.
#   3. any other version the sources serve whose orig tarball is listed (in the source index) with
#      the expected sha256, e.g. another Debian revision of 1.7.1.
#   4. otherwise it fails and says so: put the tarball (sha256 below) into third_party/ by hand.
# The downloaded tarball is checked against the sha256 again before it is kept.
#
#   bash scripts/fetch_gpu_deps.sh     # prints the tarball's path
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/third_party"
name=benchmark_1.7.1.orig.tar.gz
tarball="$dest/$name"
sha=6430e4092653380d9dc4ccb45a1e2dc9259d581f4866dc0759713126056bc1d7
want=1.7.1-1
fail() { echo "kvscout: fetch_gpu_deps: $*" >&2; exit 1; }

mkdir -p "$dest"
if [[ -f "$tarball" ]] && echo "$sha  $tarball" | sha256sum -c --status; then
  echo "$tarball"
  exit 0
fi
command -v apt-get >/dev/null || fail "apt-get not found; put $name (sha256 $sha) into $dest by hand"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp"
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/src" "$tmp/keys"
list="$tmp/sources.list"
: >"$list"

# One-line entries: `deb [options] URI suite [component...]` -> the same with `deb-src`.
oneline() {
  local f=$1 line
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line%%#*}
    [[ $line =~ ^[[:space:]]*deb[[:space:]]+(.*)$ ]] || continue
    echo "deb-src ${BASH_REMATCH[1]}" >>"$list"
  done <"$f"
}

# deb822 stanzas: for each URI x suite of a stanza whose Types has `deb` (and not Enabled: no),
# a one-line deb-src entry; Signed-By as a path, or an inline key written to a file.
deb822() {
  local f=$1
  awk -v keys="$tmp/keys" -v base="$(basename "$f")" '
    function flush(   i, j, nu, ns, u, s, opts, kf) {
      if (types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(enabled) != "no" && uris != "" && suites != "") {
        opts = ""
        if (signed != "") {
          if (signed ~ /BEGIN PGP/) {
            kf = keys "/" base "." (++nkey) ".asc"
            printf "%s", signed > kf
            close(kf)
            opts = "signed-by=" kf
          } else {
            sub(/[ \t\n]+$/, "", signed)
            opts = "signed-by=" signed
          }
        }
        if (arch != "") opts = opts (opts != "" ? " " : "") "arch=" arch
        nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
        for (i = 1; i <= nu; ++i) for (j = 1; j <= ns; ++j)
          if (u[i] != "" && s[j] != "")
            print "deb-src" (opts != "" ? " [" opts "]" : "") " " u[i] " " s[j] " " comps
      }
      types = uris = suites = comps = signed = enabled = arch = ""; field = ""
    }
    /^#/ { next }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]/ {                        # continuation line
      if (field == "signed-by") {
        v = $0; sub(/^[ \t]/, "", v); if (v == ".") v = ""
        signed = signed v "\n"
      }
      next
    }
    {
      field = tolower($0); sub(/:.*/, "", field)
      v = $0; sub(/^[^:]*:[ \t]*/, "", v); sub(/[ \t]+$/, "", v)
      if (field == "types") types = v
      else if (field == "uris") uris = v
      else if (field == "suites") suites = v
      else if (field == "components") comps = v
      else if (field == "enabled") enabled = v
      else if (field == "architectures") { arch = v; gsub(/[ \t]+/, ",", arch) }
      else if (field == "signed-by") signed = (v != "" ? v "\n" : "")
    }
    END { flush() }
  ' "$f" >>"$list"
}

[[ -f /etc/apt/sources.list ]] && oneline /etc/apt/sources.list
for f in /etc/apt/sources.list.d/*.list; do [[ -f $f ]] && oneline "$f"; done
for f in /etc/apt/sources.list.d/*.sources; do [[ -f $f ]] && deb822 "$f"; done
grep -q '^deb-src' "$list" || fail "no deb entries in this machine's apt sources"

apt_opts=(-o Dir::Etc::SourceList="$list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache"
  -o Dir::Cache::pkgcache="" -o Dir::Cache::srcpkgcache="")
# apt downloads as the unprivileged _apt user when it runs as root: let it write here.
if [[ $(id -u) -eq 0 ]] && id _apt >/dev/null 2>&1; then
  chown -R _apt "$tmp/lists" "$tmp/cache" "$tmp/src"
fi
echo "kvscout: reading the source indexes of $(grep -c '^deb-src' "$list") apt source entries" >&2
apt-get "${apt_opts[@]}" -qq update >&2 || fail "apt-get update on the derived deb-src entries failed"

# Which served version's orig tarball has our sha256: `want` first, then the others.
versions=$(apt-cache "${apt_opts[@]}" showsrc benchmark 2>/dev/null | awk -v sha="$sha" -v name="$name" '
  /^Package:/ { pkg = $2 }
  /^Version:/ { ver = $2 }
  /^Checksums-Sha256:/ { in_sums = 1; next }
  /^[^ ]/ { in_sums = 0 }
  in_sums && pkg == "benchmark" && $1 == sha && $3 == name { print ver }
' | sort -u)
served=$(apt-cache "${apt_opts[@]}" showsrc benchmark 2>/dev/null | awk '/^Version:/ { print $2 }' |
  sort -u | tr '\n' ' ')
[[ -n $served ]] || fail "the apt sources serve no source package 'benchmark'; put $name (sha256 $sha) into $dest by hand"
if grep -qx -- "$want" <<<"$versions"; then
  version=$want
elif [[ -n $versions ]]; then
  version=$(head -n 1 <<<"$versions")
  echo "kvscout: benchmark $want is not served; $version has the same orig tarball" >&2
else
  fail "no served version of the source package 'benchmark' (served: ${served% }) has $name with sha256 $sha; put it into $dest by hand"
fi

echo "kvscout: apt-get source --download-only benchmark=$version" >&2
(cd "$tmp/src" && apt-get "${apt_opts[@]}" -qq source --download-only "benchmark=$version" >&2) ||
  fail "apt-get source benchmark=$version failed"
[[ -f "$tmp/src/$name" ]] || fail "apt-get source gave no $name"
echo "$sha  $tmp/src/$name" | sha256sum -c --status || fail "sha256 mismatch for $name"
cp "$tmp/src/$name" "$tarball.part"
mv "$tarball.part" "$tarball"
echo "$tarball"

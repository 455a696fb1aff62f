#!/usr/bin/env bash
# Puts the newest containerd 2.x that Debian's packages offer into a private prefix beside the
# system's containerd, which stays untouched: containerd 2.x is in Debian's unstable suite, so
# this reads that suite's package list with a private apt state (the mirror the machine's own
# apt uses), downloads the package and unpacks it without installing it.
#
#   scripts/containerd2.sh [PREFIX]      # default: .cache/containerd2 in this checkout
#
# PREFIX/usr/bin then holds containerd, containerd-shim-runc-v2 and ctr (which use the
# system's runc), and PREFIX/VERSION the package version it got. Nothing is done when that
# version is still the suite's newest. Exits non-zero with one line when it cannot get it.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$(realpath -m "${1:-.cache/containerd2}")
state="$prefix.apt"

fail() { echo "containerd2.sh: $*" >&2; exit 1; }
command -v apt-get >/dev/null || fail "apt-get not found: containerd 2.x comes from Debian's packages"

mirror=$(scripts/debian-mirror.sh) || exit 1
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || fail "$keyring missing (Debian package debian-archive-keyring)"

mkdir -p "$state/etc" "$state/lists/partial" "$state/cache/archives/partial" "$state/download"
printf 'Types: deb\nURIs: %s\nSuites: sid\nComponents: main\nSigned-By: %s\n' "$mirror" "$keyring" \
  > "$state/etc/sid.sources"
apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$state/etc"
          -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
          -o "Dir::State::status=/dev/null" -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" -qq update >/dev/null 2>"$state/update.err" \
  || fail "apt-get update of suite sid from $mirror failed: $(tail -1 "$state/update.err")"
version=$(apt-cache "${apt_opts[@]}" policy containerd | sed -n 's/^[[:space:]]*Candidate:[[:space:]]*//p')
case "$version" in
  2.*) ;;
  "" | "(none)") fail "Debian's unstable suite at $mirror offers no containerd package" ;;
  *) fail "Debian's unstable suite offers containerd $version, not a 2.x" ;;
esac

if [ "$(cat "$prefix/VERSION" 2>/dev/null)" = "$version" ] && "$prefix/usr/bin/containerd" --version >/dev/null 2>&1; then
  echo "containerd2.sh: containerd $version already in $prefix"
  exit 0
fi
rm -f "$state"/download/*.deb
(cd "$state/download" && apt-get "${apt_opts[@]}" -qq download "containerd=$version" >/dev/null 2>"$state/download.err") \
  || fail "apt-get download containerd=$version failed: $(tail -1 "$state/download.err")"
rm -rf "$prefix.new"
dpkg -x "$state"/download/containerd_*.deb "$prefix.new"
"$prefix.new/usr/bin/containerd" --version >/dev/null 2>&1 \
  || fail "containerd $version does not run here: $("$prefix.new/usr/bin/containerd" --version 2>&1 | head -1)"
echo "$version" > "$prefix.new/VERSION"
rm -rf "$prefix"
mv "$prefix.new" "$prefix"
echo "containerd2.sh: containerd $version from $mirror (suite sid) unpacked into $prefix"

#!/usr/bin/env bash
# Prints the machine's own Debian mirror: the first archive URI in its apt sources that is not
# the security archive (deb822 .sources files and one-line sources.list entries alike). The
# scripts that fetch Debian packages (containerd2.sh, image.sh) use it, so they reach only the
# mirror the machine's apt already uses. Exits 1 with one line when there is none.
set -euo pipefail
mirror=$( { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n'
            cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
              | sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p'
          } | grep -v -i security | grep -m1 '^http' || true)
[ -n "$mirror" ] || { echo "debian-mirror.sh: no Debian mirror found in /etc/apt/sources.list{,.d}" >&2; exit 1; }
echo "$mirror"

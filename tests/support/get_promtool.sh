#!/bin/sh
# promtool for the tests of the Prometheus rule files: build/prometheus/bin/promtool.  Taken
# from Debian's prometheus package, unpacked into the build folder (no system install, no
# server started).  Exit status 3: this machine can get it neither way (no apt-get); the tests
# then say why.
set -eu
DEST=build/prometheus
BIN="$DEST/bin"
if [ -x "$BIN/promtool" ]; then
    exit 0
fi
mkdir -p "$BIN"
if command -v promtool >/dev/null 2>&1; then
    ln -sf "$(command -v promtool)" "$BIN/promtool"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "get_promtool: no promtool on PATH and no apt-get/dpkg-deb to fetch Debian's prometheus" >&2
    exit 3
fi
PKG="$DEST/pkg"
rm -rf "$PKG" && mkdir -p "$PKG"
cd "$PKG"
if ! apt-get download prometheus >/dev/null 2>&1; then
    echo "get_promtool: updating the apt package lists" >&2
    apt-get update -qq >/dev/null
    apt-get download prometheus >/dev/null
fi
dpkg-deb -x prometheus_*.deb root
cd - >/dev/null
cp "$PKG/root/usr/bin/promtool" "$BIN/promtool"
rm -rf "$PKG"
"$BIN/promtool" --version | head -1

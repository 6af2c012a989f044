#!/bin/sh
# etcd for the cluster tests and for a local cluster: build/etcd/bin/etcd (and etcdctl).
# Taken from Debian's etcd-server / etcd-client packages, unpacked into the build folder (no
# system install).  Exit status 3: this machine can get neither (no apt-get); the cluster tests
# then say why.
set -eu
DEST=build/etcd
BIN="$DEST/bin"
if [ -x "$BIN/etcd" ] && [ -x "$BIN/etcdctl" ]; then
    exit 0
fi
mkdir -p "$BIN"
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
    ln -sf "$(command -v etcd)" "$BIN/etcd"
    ln -sf "$(command -v etcdctl)" "$BIN/etcdctl"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "get_etcd: no etcd on PATH and no apt-get/dpkg-deb to fetch Debian's etcd-server" >&2
    exit 3
fi
PKG="$DEST/pkg"
rm -rf "$PKG" && mkdir -p "$PKG"
cd "$PKG"
if ! apt-get download etcd-server etcd-client >/dev/null 2>&1; then
    echo "get_etcd: updating the apt package lists" >&2
    apt-get update -qq >/dev/null
    apt-get download etcd-server etcd-client >/dev/null
fi
for deb in etcd-server_*.deb etcd-client_*.deb; do
    dpkg-deb -x "$deb" root
done
cd - >/dev/null
cp "$PKG/root/usr/bin/etcd" "$BIN/etcd"
cp "$PKG/root/usr/bin/etcdctl" "$BIN/etcdctl"
rm -rf "$PKG"
"$BIN/etcd" --version | head -1

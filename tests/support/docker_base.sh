#!/bin/sh
# Everything the broker image needs on a machine that reaches Debian's package mirror but no
# container registry, set up once and reused afterwards:
#   1. Debian's docker.io, docker-compose and debootstrap (installed with apt when missing);
#   2. a running Docker engine (dockerd started in the background when `docker info` fails,
#      its log in build/docker/dockerd.log);
#   3. the base image txmq-base:bookworm: a minimal bookworm root file system with python3 and
#      venv, made by debootstrap from the Debian mirror apt is configured with, then imported.
#
# Exit status: 0 ready, 3 this machine cannot do it (not root, no apt-get), 1 anything else.
set -eu

SUITE=bookworm
IMAGE=txmq-base:bookworm
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LOGDIR=$ROOT/build/docker
DOCKERD_WAIT=${TXMQ_DOCKERD_WAIT:-60}
START=$(date +%s)

say() { echo "docker-setup [$(($(date +%s) - START))s]: $*"; }
cannot() {
    echo "docker-setup: cannot set up Docker here: $*" >&2
    exit 3
}

PATH=$PATH:/usr/sbin:/sbin
export PATH

# --- 1. packages ------------------------------------------------------------------------------
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v docker-compose >/dev/null 2>&1 || missing="$missing docker-compose"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
    [ "$(id -u)" = 0 ] || cannot "not root, and missing:$missing (install them with apt-get)"
    command -v apt-get >/dev/null 2>&1 || cannot "no apt-get to install$missing"
    say "installing$missing (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq $missing >/dev/null
    say "installed$missing"
fi

# --- 2. the engine ----------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || cannot "no Docker engine answers, and only root can start dockerd"
    mkdir -p "$LOGDIR"
    say "starting dockerd (log: $LOGDIR/dockerd.log)"
    # Its own session: an interrupted make or test run does not take the engine down with it.
    setsid dockerd >>"$LOGDIR/dockerd.log" 2>&1 </dev/null &
    waited=0
    until docker info >/dev/null 2>&1; do
        if [ "$waited" -ge "$DOCKERD_WAIT" ]; then
            echo "docker-setup: dockerd did not answer within ${DOCKERD_WAIT}s; its log ends:" >&2
            tail -n 20 "$LOGDIR/dockerd.log" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    say "dockerd is up"
fi

# --- 3. the base image ------------------------------------------------------------------------
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE is there"
    exit 0
fi

# The first mirror apt uses for this release (or for the host's own release, whose mirror
# carries this one too): "deb URI SUITE ..." lines and deb822 stanzas (Types/URIs/Suites).
host_suite=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
mirror=$(
    {
        cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk -v a="$SUITE" -v b="$host_suite" '$1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == a || $(i + 1) == b) print $i
            }'
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] || continue
            awk -v a="$SUITE" -v b="$host_suite" 'BEGIN { RS = ""; FS = "\n" } {
                uri = ""; ours = 0; deb = 0; off = 0
                for (i = 1; i <= NF; i++) {
                    n = split($i, w, /[ \t]+/)
                    if (w[1] == "URIs:") uri = w[2]
                    if (w[1] == "Enabled:" && w[2] == "no") off = 1
                    for (j = 2; j <= n; j++) {
                        if (w[1] == "Types:" && w[j] == "deb") deb = 1
                        if (w[1] == "Suites:" && (w[j] == a || w[j] == b)) ours = 1
                    }
                }
                if (deb && ours && !off && uri != "") print uri
            }' "$f"
        done
    } | head -n 1
)
[ -n "$mirror" ] || cannot "no Debian mirror found in /etc/apt/sources.list(.d)"
[ "$(id -u)" = 0 ] || cannot "debootstrap needs root"
mkdir -p "$LOGDIR"

work=$(mktemp -d "${TMPDIR:-/tmp}/txmq-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
say "debootstrap $SUITE from $mirror (log: $LOGDIR/debootstrap.log)"
if ! debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$work/rootfs" \
    "$mirror" >"$LOGDIR/debootstrap.log" 2>&1; then
    echo "docker-setup: debootstrap failed; its log ends:" >&2
    tail -n 20 "$LOGDIR/debootstrap.log" >&2
    exit 1
fi
# What an image does not need: downloaded packages, package lists, documentation.
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/cache/apt/*.bin \
    "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/usr/share/doc/* \
    "$work"/rootfs/usr/share/man/* "$work"/rootfs/usr/share/locale/*
say "importing $IMAGE"
tar -C "$work/rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE" >/dev/null
say "$IMAGE is ready"

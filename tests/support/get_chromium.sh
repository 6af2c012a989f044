#!/bin/sh
# The browser of the web console's tests (tests/integration/test_console.py): Debian's chromium
# and chromium-driver (one source package, so the driver always matches the browser), installed
# with apt when missing.  Exit status 3: this machine cannot (not root, no apt-get); the console
# tests then say why (and fail under CI).
set -eu
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "get_chromium: chromium/chromedriver missing and not root (apt-get install chromium chromium-driver)" >&2
    exit 3
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "get_chromium: chromium/chromedriver missing and no apt-get to install them" >&2
    exit 3
fi
export DEBIAN_FRONTEND=noninteractive
echo "get_chromium: installing chromium and chromium-driver (apt-get)" >&2
if ! apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium chromium-driver >/dev/null
fi
chromium --version

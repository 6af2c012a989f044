"""A real headless browser for the web console's tests: Debian's chromium driven by Selenium
through Debian's chromium-driver (the two come from the same source package, so their versions
always match), and ``txmq console`` in a child process.

Where the browser is missing (``make pytest`` installs it with tests/support/get_chromium.sh
when it can), the tests skip saying why, and fail under CI (``CI=true``).  ``TXMQ_CHROMIUM`` and
``TXMQ_CHROMEDRIVER`` name other binaries."""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support import scratch

#: Seconds a page may take to show what a test waits for.
PAGE_TIMEOUT = 30.0


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name) or shutil.which(name, path="/usr/lib/chromium:/usr/bin")
        if found:
            return found
    return None


def _given(variable: str) -> str | None:
    """The executable an environment variable names; "" (missing) when it names none."""
    value = os.environ.get(variable)
    if value is None:
        return None
    return value if os.access(value, os.X_OK) else ""


def need_chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver, or skip (fail under CI) saying what is
    missing."""
    browser = _given("TXMQ_CHROMIUM")
    driver = _given("TXMQ_CHROMEDRIVER")
    browser = _find("chromium", "chromium-browser") if browser is None else browser or None
    driver = _find("chromedriver") if driver is None else driver or None
    try:
        import selenium  # noqa: F401
    except ImportError:
        selenium_missing = True
    else:
        selenium_missing = False
    missing = [
        what
        for what, gone in (
            ("chromium (apt-get install chromium)", browser is None),
            ("chromedriver (apt-get install chromium-driver)", driver is None),
            ("the selenium package (the dev extra)", selenium_missing),
        )
        if gone
    ]
    if missing:
        why = (
            f"the console's browser tests need {', '.join(missing)}; "
            "`make pytest` installs them with tests/support/get_chromium.sh when it runs as root"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    assert browser is not None and driver is not None
    return browser, driver


@contextmanager
def chromium(width: int = 1280, height: int = 900, extra_args: Sequence[str] = ()) -> Iterator[Any]:
    """A headless chromium under WebDriver (with ``extra_args`` on its command line); quit at
    the end."""
    browser, driver_path = need_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={width},{height}",
        *extra_args,
    ):
        options.add_argument(arg)
    # Chromium's own temporary files (its singleton socket folder) go to the run's scratch
    # folder, removed at the end of the run, instead of /tmp.
    run_scratch = scratch.root()
    env = dict(os.environ, TMPDIR=run_scratch) if run_scratch else None
    driver = webdriver.Chrome(options=options, service=Service(driver_path, env=env))
    driver.set_page_load_timeout(PAGE_TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


class ConsoleProcess:
    """``txmq [--access-key AK] console --broker ADDRESS --listen 127.0.0.1:0 [EXTRA...]`` as a
    child process (the secret goes through the environment, as docs/console.md advises)."""

    def __init__(
        self,
        broker: str,
        access_key: str | None = None,
        secret_key: str | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.broker = broker
        self.extra = list(extra)
        self.access_key = access_key
        self.secret_key = secret_key
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: list[str] = []

    def start(self, timeout: float = 30.0) -> str:
        cmd = [sys.executable, "-m", "txmq"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.access_key:
            cmd += ["--access-key", self.access_key]
            env["TXMQ_SECRET_KEY"] = self.secret_key or ""
        cmd += ["console", "--broker", self.broker, "--listen", "127.0.0.1:0", *self.extra]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        )
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    break
                line = self.proc.stdout.readline()
                if not line:
                    break
                self.output.append(line)
                if " on http://" in line or " on https://" in line:
                    self.url = line.rsplit(" on ", 1)[1].strip()
                    return self.url
        finally:
            sel.close()
        self.stop()
        pytest.fail(f"txmq console did not start within {timeout}s; it printed: {self.output}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout``); the exit status (None: never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

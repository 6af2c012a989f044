"""Shared fixtures: real brokers on port 0 with real stores in temporary folders."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.support import scratch
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController, new_event_loop

#: Fast timers for tests; production defaults stay in BrokerConfig.
FAST = dict(
    listen_port=0,
    flush_interval_commit_log=20,
    mapped_file_size_commit_log=64 * 1024 * 1024,
    mapped_file_size_consume_queue=20 * 10_000,
    message_delay_level="100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s 1s 1s 1s 1s "
    "1s 1s 1s 1s",
    transaction_check_interval=200,
    transaction_time_out=300,
    transaction_check_request_timeout=1000,
    shutdown_timeout=5.0,
)


# A loaded machine must not fail a property test on its clock: no deadlines anywhere.
settings.register_profile("txmq", deadline=None)
settings.load_profile("txmq")

#: Seconds one phase (setup, call, teardown) of a test may take before the guard below stops it.
PHASE_TIMEOUT = float(os.environ.get("TXMQ_TEST_TIMEOUT", "180"))


class _PhaseGuard:
    """Stops a stuck test phase with a stack instead of letting the run hang.

    pytest-timeout's SIGALRM handler raises in the main thread, but under uvloop a Python signal
    handler runs inside a loop callback, where an exception is logged and dropped: a test that
    awaits forever is never stopped.  This handler therefore cancels every task of the running
    loop (the test's coroutine fails with CancelledError and its fixtures unwind), and raises
    only where no loop runs (a blocking call in a sync test).  Either way the stacks of all
    threads and tasks are printed first.  pytest-timeout (thread method, ``timeout`` in
    pyproject) stays as the last resort that ends the process.
    """

    def __init__(self, item: pytest.Item, phase: str) -> None:
        self.what = f"{item.nodeid} ({phase})"
        # a test that needs longer says so with pytest-timeout's marker, which it also obeys
        marker = item.get_closest_marker("timeout")
        self.seconds = float(marker.args[0]) if marker and marker.args else PHASE_TIMEOUT

    def _fire(self, signum: int, frame: Any) -> None:
        sys.stderr.write(f"\n=== {self.what} still running after {self.seconds:.0f}s ===\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        loop = asyncio._get_running_loop()
        if loop is None:
            pytest.fail(f"{self.what} timed out after {self.seconds:.0f}s")
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=sys.stderr)
            task.cancel(f"{self.what} timed out after {self.seconds:.0f}s")
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # cancel again if something swallowed it

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


#: Free space the run needs in the temporary folder (its peak use, measured, with room to spare).
#: Below it the run stops at once with one clear line instead of hundreds of brokers failing to
#: start on a full disk.  TXMQ_TEST_MIN_FREE_GB overrides it.
MIN_FREE_GB = float(os.environ.get("TXMQ_TEST_MIN_FREE_GB", "3"))
_scratch: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Check the disk, and give the JVMs of the run (Spark drivers and executors, the stock
    Java clients) a scratch folder of the run's own for what they would leave in /tmp (Spark's
    block managers and artifacts, native libraries unpacked by lz4 and snappy), removed when the
    run ends: a driver a test SIGKILLs never cleans up after itself."""
    global _scratch
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    if free < MIN_FREE_GB:
        pytest.exit(
            f"only {free:.1f} GiB free in {tmp}; the suite needs about {MIN_FREE_GB:.0f} GiB "
            "(brokers' stores, Spark, Docker builds): free some space, or point TMPDIR at a "
            "bigger disk",
            returncode=3,
        )
    _scratch = tempfile.mkdtemp(prefix="txmq-test-scratch-")
    os.makedirs(os.path.join(_scratch, "java"))
    os.environ[scratch.ENV] = _scratch
    for name, value in scratch.jvm_env(_scratch).items():
        before = os.environ.get(name, "") if name.endswith("_OPTS") else ""
        os.environ[name] = f"{before} {value}".strip()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str:
    tmp = tempfile.gettempdir()
    return f"temporary folder: {tmp}, {shutil.disk_usage(tmp).free / 2**30:.1f} GiB free"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _PhaseGuard(item, "setup").armed():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _PhaseGuard(item, "call").armed():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    with _PhaseGuard(item, "teardown").armed():
        yield
    if _drives_processes(item):
        # What it left behind (a stock client's pipes, a Spark gateway's sockets) is collected
        # now, under its own rule, not during a later test whose rule is "error".
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


#: Folders whose tests drive other processes through libraries of their own (stock RocketMQ
#: clients, Spark, etcd, Docker, a browser).
_PROCESS_FOLDERS = frozenset({"integration", "cluster", "compat", "spark"})


def _drives_processes(item: pytest.Item) -> bool:
    folder = os.path.relpath(str(item.path), os.path.dirname(__file__)).split(os.sep)[0]
    return folder in _PROCESS_FOLDERS or item.get_closest_marker("external") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ResourceWarning fails a test (pyproject's filterwarnings): an in-process test that
    leaks a socket or a file of the broker's or the SDK's finds the leak.  Tests that drive
    other processes (the ``external`` marker and the folders above) leave the lifetimes of
    those processes' pipes to the libraries that run them: there it is ignored."""
    for item in items:
        if _drives_processes(item):
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A test that configures logging (the CLI does, through click's CliRunner, onto a stream
    that is gone once the command returns) must not leave later tests logging into it."""
    import logging

    import structlog

    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]]:
    """The suite runs under uvloop, as the broker does in production."""
    return {"uvloop": new_event_loop}


@pytest.fixture
def make_broker_config(tmp_path: Any) -> Callable[..., BrokerConfig]:
    """``make_broker_config(**overrides)``: a config with a fresh store folder and fast
    timers."""
    counter = iter(range(1000))

    def make(**overrides: Any) -> BrokerConfig:
        values: dict[str, Any] = dict(FAST)
        values["store_path_root_dir"] = str(tmp_path / f"store{next(counter)}")
        values.update(overrides)
        return BrokerConfig(**values)

    return make


@pytest.fixture
async def broker(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[BrokerController]:
    """A started broker in the test's own event loop."""
    controller = BrokerController(make_broker_config())
    await controller.start()
    try:
        yield controller
    finally:
        await controller.shutdown()


class BrokerThread:
    """A broker running in a background thread with its own (uv)loop, for code that blocks
    (the SDK's sync facade)."""

    def __init__(self, config: BrokerConfig, **kwargs: Any) -> None:
        self.config = config
        self.kwargs = kwargs
        self.loop = new_event_loop()
        self.controller: BrokerController | None = None
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="test-broker"
        )

    def start(self) -> BrokerController:
        self._thread.start()
        self.controller = BrokerController(self.config, **self.kwargs)
        self.call(self.controller.start())
        return self.controller

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run a plain function on the broker's loop thread (the store is not thread-safe)."""

        async def wrapper() -> Any:
            return fn()

        return self.call(wrapper())

    def stop(self) -> None:
        if self.controller is not None:
            self.call(self.controller.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    @property
    def address(self) -> str:
        assert self.controller is not None
        return self.controller.address


@pytest.fixture
def broker_thread(make_broker_config: Callable[..., BrokerConfig]) -> Iterator[BrokerController]:
    bt = BrokerThread(make_broker_config())
    controller = bt.start()
    controller.test_thread = bt  # type: ignore[attr-defined]
    try:
        yield controller
    finally:
        bt.stop()


@pytest.fixture
def broker_thread_factory(
    make_broker_config: Callable[..., BrokerConfig],
) -> Iterator[Callable[..., BrokerThread]]:
    """Start brokers in threads with custom configs; all are stopped at the end."""
    started: list[BrokerThread] = []

    def make(config: BrokerConfig | None = None, **overrides: Any) -> BrokerThread:
        bt = BrokerThread(config or make_broker_config(**overrides))
        bt.start()
        started.append(bt)
        return bt

    yield make
    for bt in started:
        try:
            bt.stop()
        except Exception:
            pass

"""The compiled request path builds from this checkout and behaves as plain Python does.

``make test`` runs pure Python (the compiled build is opt-in, ``TXMQ_COMPILE=1``), so without
this test an edit that mypyc cannot compile, or that compiles to something behaving otherwise,
would pass the suite unseen.  It copies the tracked files to a scratch folder, compiles the
request path there in place (``setup.py build_ext --inplace``, what ``TXMQ_COMPILE=1 make
install`` runs), then runs there, on that build, the tests that need one: which modules are
loaded (``tests/test_compiled.py``) and compiled ≡ pure, answer for answer and record for record
(``tests/broker/test_compiled_equal.py``), then the in-process tests of the store, the broker
and the SDK.  The checkout itself is left as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: The compile and the build's own tests, with room on a loaded machine.
pytestmark = [pytest.mark.external, pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[1]
#: The in-process tests of what the build compiles (the store, the broker's request path, the
#: SDK's producer and connection, the wire format).
IN_PROCESS = ["tests/protocol", "tests/core", "tests/broker", "tests/client"]
#: mypyc on a loaded 2-core machine takes 1.5-5 minutes.
COMPILE_TIMEOUT = 1500


def tracked_copy(dest: Path) -> None:
    """The files git tracks, symlinks as symlinks (``txmq/broker -> ../broker``)."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    for raw in filter(None, names):
        name = os.fsdecode(raw)
        src, dst = ROOT / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, dst)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def test_the_request_path_compiles_and_matches_pure_python(tmp_path: Path) -> None:
    if os.environ.get("TXMQ_COMPILE") == "1":
        pytest.skip("this run is on the compiled build already (TXMQ_COMPILE=1)")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing names the tracked files")
    copy = tmp_path / "src"
    tracked_copy(copy)
    env = {k: v for k, v in os.environ.items() if k != "TXMQ_PURE_PYTHON"}
    env.update(TXMQ_COMPILE="1", PYTHONPATH=str(copy))
    built = subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT,
    )
    assert built.returncode == 0, (
        f"mypyc could not compile the request path:\n{tail(built.stdout + built.stderr)}"
    )
    assert (copy / "txmq" / "_compiled_manifest.json").exists(), "the build wrote no manifest"
    # what proves the build (which modules load; compiled = pure, answer for answer), then the
    # in-process tests of the modules it compiles, on it
    for args in (
        ["tests/test_compiled.py", "tests/broker/test_compiled_equal.py"],
        ["-n", "2", "-m", "not slow and not external and not spark", *IN_PROCESS],
    ):
        ran = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert ran.returncode == 0, f"on the compiled build, {args} failed:\n{tail(ran.stdout, 60)}"
        assert " passed" in ran.stdout, tail(ran.stdout)

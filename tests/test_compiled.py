"""The compiled modules (setup.py, txmq/_compiled.py): loaded when built, all of them or none,
never when ``TXMQ_PURE_PYTHON=1``, and never when a ``.py`` was edited since the build.

Each check runs a fresh interpreter, since which file a module comes from is decided at its
first import.  Without a build (``make install`` compiles where a C compiler is found) there is
nothing to load: skipped, except when ``TXMQ_COMPILE=1`` is set (``make test`` sets it where it
compiles), which asked for a compiled build, and then they fail."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import txmq
from txmq import _compiled

pytestmark = pytest.mark.external

PROBE = """
import json, sys
import txmq.broker.server, txmq.client.producer, txmq.client.transaction
from txmq import _compiled
mods = {n: sys.modules[n].__file__ for n in sorted(sys.modules) if n.startswith("txmq.")}
print(json.dumps({"status": _compiled.STATUS.describe(), "good": list(_compiled.STATUS.modules),
                  "stale": list(_compiled.STATUS.stale), "loaded": _compiled.loaded_compiled(),
                  "files": mods}))
"""


#: What a copy of the package leaves out: bytecode and the generated C.
IGNORED = shutil.ignore_patterns("__pycache__", "*.c")


def require_build() -> list[str]:
    status = _compiled.decide({})
    if status.modules:
        return list(status.modules)
    if os.environ.get("TXMQ_COMPILE") == "1":
        pytest.fail(
            f"TXMQ_COMPILE=1 asked for a compiled build, but: {status.describe()}; details {status.details}"
        )
    pytest.skip(f"not compiled here ({status.describe()}): `TXMQ_COMPILE=1 make install`")


def copy_package(dest: Path) -> Path:
    """A copy of the built package in ``dest`` (symlinks followed), with the compiled modules'
    shared native code that sits beside it (``txmq__mypyc``); the copy's ``txmq`` folder."""
    package = Path(txmq.__file__).resolve().parent
    copy = dest / "txmq"
    shutil.copytree(package, copy, symlinks=False, ignore=IGNORED)
    spec = importlib.util.find_spec("txmq__mypyc")
    assert spec is not None and spec.origin, "the compiled modules' shared library is missing"
    shutil.copy2(spec.origin, dest / Path(spec.origin).name)
    return copy


def probe(pythonpath: str | None = None, **env: str) -> tuple[dict[str, Any], str]:
    environ = {k: v for k, v in os.environ.items() if k != _compiled.PURE_ENV}
    environ.update(env)
    if pythonpath is not None:
        environ["PYTHONPATH"] = pythonpath
    # run from outside the checkout: `python -c` puts its folder first on sys.path
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        cwd=pythonpath or "/",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def version(**env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != _compiled.PURE_ENV}
    environ.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "--version"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_built_modules_are_the_ones_loaded() -> None:
    expected = require_build()
    doc, stderr = probe()
    assert doc["stale"] == [], doc["stale"]
    assert doc["good"] == expected
    # every compiled module is imported by a broker and a producer, and from its compiled file
    assert doc["loaded"] == expected, doc["files"]
    for name in expected:
        assert doc["files"][name].endswith(".so"), (name, doc["files"][name])
    assert doc["status"] == f"compiled: {len(expected)} modules"
    assert f"(compiled: {len(expected)} modules)" in version()
    assert "edited since" not in stderr


def test_pure_python_switch_loads_no_compiled_module() -> None:
    expected = require_build()
    doc, _ = probe(**{_compiled.PURE_ENV: "1"})
    assert doc["loaded"] == [] and doc["good"] == []
    for name in expected:
        assert doc["files"][name].endswith(".py"), (name, doc["files"][name])
    assert doc["status"] == "pure Python (TXMQ_PURE_PYTHON=1)"
    assert "pure Python (TXMQ_PURE_PYTHON=1)" in version(**{_compiled.PURE_ENV: "1"})


def test_an_edited_source_is_imported_instead_of_its_stale_build(tmp_path: Path) -> None:
    """A copy of the built package with one compiled module's .py edited: that module comes
    from its .py (the edit is seen), with one warning naming it, and so do all the others:
    compiled modules call each other directly, so they run all compiled or none."""
    expected = require_build()
    edited = "txmq.protocol.frame"
    assert edited in expected
    copy = copy_package(tmp_path)
    src = copy / "protocol" / "frame.py"
    src.write_text(src.read_text() + "\nEDITED_SINCE_THE_BUILD = True\n")
    doc, stderr = probe(pythonpath=str(tmp_path))
    assert doc["files"][edited] == str(src)
    assert doc["stale"] == [edited]
    assert doc["loaded"] == [] and doc["good"] == []
    for name in expected:
        assert doc["files"][name].endswith(".py"), (name, doc["files"][name])
    warnings = [line for line in stderr.splitlines() if "edited since it was compiled" in line]
    assert len(warnings) == 1 and edited in warnings[0], stderr
    assert doc["status"] == f"pure Python (edited since the build: {edited})"
    check = subprocess.run(
        [sys.executable, "-c", "import txmq.protocol.frame as f; print(f.EDITED_SINCE_THE_BUILD)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
        cwd=tmp_path,
    )
    assert check.stdout.strip() == "True", check.stderr


def test_a_compiled_module_the_manifest_does_not_list_is_not_trusted(tmp_path: Path) -> None:
    """No manifest (a build interrupted, or files copied by hand): the .py files are used."""
    expected = require_build()
    copy = copy_package(tmp_path)
    (copy / _compiled.MANIFEST.name).unlink()
    doc, _ = probe(pythonpath=str(tmp_path))
    assert doc["loaded"] == []
    assert doc["status"] == "pure Python (not compiled: no build manifest)"
    for name in expected:
        assert doc["files"][name].endswith(".py")


def test_the_copy_runs_compiled(tmp_path: Path) -> None:
    """The copy the two tests above change runs compiled as it is: what they change is what
    makes it run as Python."""
    expected = require_build()
    copy_package(tmp_path)
    doc, _ = probe(pythonpath=str(tmp_path))
    assert doc["loaded"] == expected and doc["stale"] == []
    assert all(doc["files"][name].startswith(str(tmp_path)) for name in expected)


def test_any_other_switch_value_runs_everything_as_python() -> None:
    """``TXMQ_PURE_PYTHON=txmq.broker``: no compiled module either; some compiled and some not
    is not offered (a compiled module would still call the compiled code of the others)."""
    expected = require_build()
    doc, _ = probe(**{_compiled.PURE_ENV: "txmq.broker"})
    assert doc["loaded"] == []
    for name in expected:
        assert doc["files"][name].endswith(".py")
    assert doc["status"] == "pure Python (TXMQ_PURE_PYTHON=txmq.broker)"

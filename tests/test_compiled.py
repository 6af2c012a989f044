"""The compiled modules (setup.py, txmq/_compiled.py): loaded when built, never when
``TXMQ_PURE_PYTHON=1``, and never in place of a ``.py`` edited since the build.

Each check runs a fresh interpreter, since which file a module comes from is decided at its
first import.  Without a build (compiling is opt-in: ``TXMQ_COMPILE=1 make install``) there
is nothing to load: skipped, except when ``TXMQ_COMPILE=1`` is set, which asked for a compiled
build, and then they fail."""

from __future__ import annotations

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
    from its .py (the edit is seen), with one warning naming it; the others stay compiled."""
    expected = require_build()
    edited = "txmq.protocol.frame"
    assert edited in expected
    package = Path(txmq.__file__).resolve().parent
    copy = tmp_path / "txmq"
    shutil.copytree(package, copy, symlinks=False, ignore=IGNORED)
    src = copy / "protocol" / "frame.py"
    src.write_text(src.read_text() + "\nEDITED_SINCE_THE_BUILD = True\n")
    doc, stderr = probe(pythonpath=str(tmp_path))
    assert doc["files"][edited] == str(src)
    assert doc["stale"] == [edited]
    assert edited not in doc["loaded"]
    assert sorted(doc["loaded"]) == sorted(m for m in expected if m != edited)
    warnings = [line for line in stderr.splitlines() if "edited since it was compiled" in line]
    assert len(warnings) == 1 and edited in warnings[0], stderr
    assert f"1 edited since the build run as Python: {edited}" in doc["status"]
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
    package = Path(txmq.__file__).resolve().parent
    copy = tmp_path / "txmq"
    shutil.copytree(package, copy, symlinks=False, ignore=IGNORED)
    (copy / _compiled.MANIFEST.name).unlink()
    doc, _ = probe(pythonpath=str(tmp_path))
    assert doc["loaded"] == []
    assert doc["status"] == "pure Python (not compiled: no build manifest)"
    for name in expected:
        assert doc["files"][name].endswith(".py")


def test_the_switch_can_name_some_modules() -> None:
    """``TXMQ_PURE_PYTHON=txmq.broker``: the broker's modules run as Python, the others stay
    compiled (how a module's share of the cost is measured, bench/request_path.py)."""
    expected = require_build()
    doc, _ = probe(**{_compiled.PURE_ENV: "txmq.broker"})
    assert doc["loaded"] == [m for m in expected if not m.startswith("txmq.broker.")]
    for name in expected:
        assert doc["files"][name].endswith(".py" if name.startswith("txmq.broker.") else ".so")

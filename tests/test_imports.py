"""Every module of txmq can be the first one a program imports: each is imported in a fresh
interpreter of its own (an import cycle that a test run hides, because something else imported
the other side first, fails here)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.test_layering import PACKAGES, ROOT, module_name

pytestmark = pytest.mark.external


def _modules() -> list[str]:
    out = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "/v2/" not in str(path):
                out.append(module_name(path))
    return out


def _import_alone(module: str) -> str | None:
    r = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(ROOT),
    )
    if r.returncode == 0:
        return None
    return f"{module}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = _modules()
    assert len(modules) > 100, modules
    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [f for f in pool.map(_import_alone, modules) if f is not None]
    assert not failed, "modules that cannot be imported first:\n" + "\n".join(failed)

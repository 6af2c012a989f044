"""Which of txmq's modules run compiled, and the switch back to plain Python.

``setup.py`` compiles the request path with mypyc from the same ``.py`` sources and writes
``_compiled_manifest.json`` beside this file: each compiled module's name and the SHA-256 of the
``.py`` it was compiled from.  Python prefers an extension module to the ``.py`` of the same
name, so a finder placed first on ``sys.meta_path`` (installed by ``txmq/__init__.py`` before any
sub-package is imported) decides instead, for all of them at once: the compiled modules call
each other's functions and build each other's native classes directly, not through the
import system, so one of them as Python among compiled ones would not be used by the others.

* ``TXMQ_PURE_PYTHON=1`` in the environment: every txmq module is imported from its ``.py``.
* A compiled module whose ``.py`` no longer has the recorded hash (edited since the build), or
  that is missing: every module is imported from its ``.py``, with one warning naming the
  edited ones: an edit is never shadowed by a stale build.
* No manifest (none built, or a build interrupted): the ``.py`` files are imported.

:data:`STATUS` says what was decided; ``txmq broker`` logs it at start and ``txmq --version``
prints it.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

PURE_ENV = "TXMQ_PURE_PYTHON"
PACKAGE = "txmq"
PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / "_compiled_manifest.json"

log = logging.getLogger("txmq.compiled")


@dataclass(frozen=True)
class CompiledStatus:
    """What this process imports compiled.  ``modules``: the compiled modules, all of them
    imported compiled, or none; ``stale``: compiled but edited since (then every module is
    imported from its ``.py``); ``pure_reason``: why nothing is compiled, or empty."""

    modules: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    pure_reason: str = ""
    details: dict[str, str] = field(default_factory=dict)

    @property
    def compiled(self) -> bool:
        return bool(self.modules)

    def describe(self) -> str:
        if not self.modules:
            if self.stale:
                return f"pure Python ({self.pure_reason}: {', '.join(self.stale)})"
            return f"pure Python ({self.pure_reason})"
        return f"compiled: {len(self.modules)} modules"


def source_path(module: str) -> Path:
    """The ``.py`` of ``txmq.a.b`` (``txmq/a/b.py``)."""
    parts = module.split(".")
    return PACKAGE_DIR.joinpath(*parts[1:]).with_suffix(".py")


def extension_path(module: str) -> Path | None:
    """The compiled module beside the ``.py`` of ``module``, if there is one."""
    src = source_path(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = src.with_suffix(suffix)
        if candidate.is_file():
            return candidate
    return None


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(path: Path = MANIFEST) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): str(v) for k, v in data.items()}


def decide(environ: Mapping[str, str] | None = None) -> CompiledStatus:
    """Whether this process may import the compiled modules (nothing is imported here)."""
    env = os.environ if environ is None else environ
    switch = env.get(PURE_ENV, "").strip()
    if switch not in ("", "0"):
        return CompiledStatus(pure_reason=f"{PURE_ENV}={switch}")
    manifest = read_manifest()
    if manifest is None:
        return CompiledStatus(pure_reason="not compiled: no build manifest")
    stale: list[str] = []
    details: dict[str, str] = {}
    for module, digest in sorted(manifest.items()):
        if extension_path(module) is None:
            details[module] = "no compiled module"
            continue
        try:
            current = source_hash(source_path(module))
        except OSError as exc:
            details[module] = f"source unreadable: {exc}"
            continue
        if current != digest:
            stale.append(module)
            details[module] = "source edited since the build"
    if stale:
        return CompiledStatus((), tuple(stale), "edited since the build", details)
    if details:
        missing = ", ".join(sorted(details))
        return CompiledStatus(pure_reason=f"not compiled: incomplete build ({missing})")
    if not manifest:
        return CompiledStatus(pure_reason="not compiled: an empty build manifest")
    return CompiledStatus(tuple(sorted(manifest)), (), "", details)


class SourceFirstFinder(importlib.abc.MetaPathFinder):
    """Imports a txmq module from its ``.py`` unless it is one of ``trusted`` (whose compiled
    module then loads the usual way)."""

    def __init__(self, trusted: Sequence[str]) -> None:
        self.trusted = frozenset(trusted)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if path is None or fullname in self.trusted or not fullname.startswith(PACKAGE + "."):
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            src = os.path.join(entry, leaf + ".py")
            if not os.path.isfile(src):
                continue
            base = src[:-3]
            if not any(os.path.isfile(base + s) for s in importlib.machinery.EXTENSION_SUFFIXES):
                return None  # nothing compiled here: the usual import is the .py already
            return importlib.util.spec_from_file_location(fullname, src)
        return None


STATUS = CompiledStatus()


def install() -> CompiledStatus:
    """Decide once and put the finder first on ``sys.meta_path`` (idempotent)."""
    global STATUS
    for finder in sys.meta_path:
        if isinstance(finder, SourceFirstFinder):
            return STATUS
    STATUS = decide()
    for module in STATUS.stale:
        log.warning(
            "txmq: %s was edited since it was compiled; importing every module from its .py "
            "(rebuild with `make install` to compile them again)",
            module,
        )
    sys.meta_path.insert(0, SourceFirstFinder(STATUS.modules))
    return STATUS


def loaded_compiled() -> list[str]:
    """The txmq modules imported so far from a compiled file."""
    out = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(PACKAGE + "."):
            continue
        spec = getattr(module, "__spec__", None)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            out.append(name)
    return sorted(out)

"""Compiles the request path with Cython (pure-Python mode: the same ``.py`` sources).

Everything else is in pyproject.toml.  Each compiled module keeps its ``.py`` as the fallback:
``TXMQ_PURE_PYTHON=1`` imports only the ``.py`` files, and a module whose ``.py`` no longer
matches the hash recorded here at build time is imported from its ``.py`` (see
``txmq/_compiled.py``).

Compiling is opt-in: ``TXMQ_COMPILE=1 make install`` (or ``make wheel``, any ``pip install``).
Measured on CPython 3.11 the modules compiled unchanged cost more CPU per request than the
same modules run by the interpreter (docs/performance.md, "The compiled request path"), so a
plain build stays pure Python: a py3-none-any wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent

#: The modules compiled, chosen by profile (the request path of a send, a transaction and a
#: pull on the broker, and the SDK's send).  Each must stay importable as plain Python.
COMPILED = [
    "txmq.protocol.aio",
    "txmq.protocol.frame",
    "txmq.protocol.headers",
    "txmq.protocol.message",
    "txmq.protocol.command",
    "txmq.broker.messaging.fastpath",
    "txmq.broker.messaging.fastpath_one",
    "txmq.broker.messaging.fastpath_batch",
    "txmq.broker.messaging.fastpath_forms",
    "txmq.broker.messaging.outcome",
    "txmq.broker.messaging.core",
    "txmq.broker.messaging.write",
    "txmq.broker.messaging.dedup",
    "txmq.broker.messaging.index",
    "txmq.broker.processors.send",
    "txmq.broker.store.commit_log",
    "txmq.broker.store.message_store",
    "txmq.broker.store.appends",
    "txmq.broker.store.reads",
    "txmq.broker.store.results",
    "txmq.broker.store.consume_queue",
    "txmq.broker.metrics",
    "txmq.broker.transaction.machine",
    # what a send still ran as Python with the above compiled (cProfile): the request's
    # dispatch, the topic lookup, the consume-queue write, the key index, the subscribers told
    # of an append
    "txmq.broker.server",
    "txmq.broker.topics",
    "txmq.broker.store.queue_file",
    "txmq.broker.store.mapped_file",
    "txmq.broker.store.topic_config",
    "txmq.broker.store.index",
    "txmq.broker.schedule",
    "txmq.broker.flush",
    "txmq.broker.messaging.hold",
    "txmq.broker.messaging.timer",
    "txmq.client.remoting",
    "txmq.client.producer",
    "txmq.client._validation",
]

#: Written beside the compiled modules at build time: module name -> SHA-256 of the .py
#: each was compiled from.
MANIFEST_NAME = "_compiled_manifest.json"
HASHES: dict[str, str] = {}

DIRECTIVES = {
    "language_level": 3,
    "binding": True,
    # annotations are documentation and mypy's: they never change what the code does
    "annotation_typing": False,
    "embedsignature": False,
    "always_allow_keywords": True,
}


def _source(module: str) -> Path:
    return HERE.joinpath(*module.split(".")).with_suffix(".py")


def _extensions() -> list:  # type: ignore[type-arg]
    if os.environ.get("TXMQ_COMPILE") != "1":
        return []  # a plain py3-none-any wheel
    from Cython.Build import cythonize
    from setuptools import Extension

    exts = [
        Extension(m, [str(_source(m).relative_to(HERE))], extra_compile_args=["-O2", "-g0"])
        for m in COMPILED
    ]
    built = cythonize(
        exts,
        compiler_directives=DIRECTIVES,
        nthreads=int(os.environ.get("TXMQ_COMPILE_JOBS", "0")) or (os.cpu_count() or 1),
        quiet=True,
    )
    HASHES.update({m: hashlib.sha256(_source(m).read_bytes()).hexdigest() for m in COMPILED})
    return built


def _built_in_place(module: str) -> Path | None:
    """The module compiled in place from the same source, by this interpreter, if there is one."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = _source(module).with_name(module.rpartition(".")[2] + suffix)
    try:
        manifest = json.loads((HERE / "txmq" / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    if built.is_file() and HASHES.get(module) and manifest.get(module) == HASHES[module]:
        return built
    return None


class BuildExt(build_ext):
    """Writes the manifest beside the compiled modules it describes, once they are built: in
    the build folder (what a wheel packs) and, built in place (``make install``), beside the
    sources.  A manifest never describes compiled files of another build."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # the modules compile one per core
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext: Any) -> None:
        # A wheel built after `make install` reuses the modules compiled in place when the
        # manifest beside them says they come from the very sources of this build.
        done = None if self.force else _built_in_place(ext.name)
        if done is None:
            super().build_extension(ext)
            return
        target = self.get_ext_fullpath(ext.name)
        self.mkpath(os.path.dirname(target))
        self.copy_file(str(done), target)

    def copy_file(self, infile: str, outfile: str, *args: Any, **kwargs: Any) -> Any:
        # A compiled module copied beside the sources replaces the old file rather than
        # writing into it: a process that has the old one loaded keeps its pages.
        if outfile.endswith(tuple(EXTENSION_SUFFIXES)) and os.path.isfile(outfile):
            os.unlink(outfile)
        return super().copy_file(infile, outfile, *args, **kwargs)

    def run(self) -> None:
        super().run()
        if not HASHES:
            return
        text = json.dumps(HASHES, indent=1, sort_keys=True) + "\n"
        built = Path(self.build_lib) / "txmq" / MANIFEST_NAME
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_text(text)
        if self.inplace:
            (HERE / "txmq" / MANIFEST_NAME).write_text(text)


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})

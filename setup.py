"""Compiles the request path with mypyc (the same ``.py`` sources, typed: native classes).

Everything else is in pyproject.toml.  The compiled modules keep their ``.py`` as the fallback:
``TXMQ_PURE_PYTHON=1`` imports only the ``.py`` files, and when a compiled module's ``.py`` no
longer matches the hash recorded here at build time every module is imported from its ``.py``
(see ``txmq/_compiled.py``): compiled modules call each other directly, so they are used all
together or not at all.

Compiling is opt-in: ``TXMQ_COMPILE=1 make install`` (likewise ``make wheel``, ``make wheels``);
without it a build is a plain py3-none-any wheel.  Measured, the compiled modules cost less
for the broker's own work per request, but not yet over sockets, end to end, where the code
still run as Python dominates (docs/performance.md, "The compiled request path").  mypyc
type-checks what it compiles, so the build needs the packages the modules import and their
type information: the Makefile builds without isolation, in the project's venv (the ``dev``
extra has mypy and the stubs).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent

#: The modules compiled, chosen by profile (the request path of a send, a transaction and a
#: pull on the broker, and the SDK's send).  Each must stay importable as plain Python.  What
#: is left as Python, and why: docs/performance.md, "The compiled request path".
COMPILED = [
    "txmq.protocol.command",
    "txmq.protocol.frame",
    "txmq.protocol.message",
    "txmq.broker.messaging.dedup",
    "txmq.broker.messaging.write",
    "txmq.broker.metrics",
    "txmq.broker.store.commit_log",
    "txmq.broker.store.consume_queue",
    "txmq.broker.store.mapped_file",
    "txmq.broker.store.queue_file",
    "txmq.client.producer",
    "txmq.client._validation",
    "txmq.client.remoting",
    "txmq.broker.store.message_store",
    "txmq.broker.store.appends",
    "txmq.broker.store.reads",
    "txmq.broker.store.results",
    "txmq.broker.store.index",
    "txmq.broker.messaging.index",
    "txmq.broker.messaging.hold",
    "txmq.broker.messaging.timer",
    "txmq.broker.transaction.machine",
    "txmq.broker.topics",
    "txmq.broker.flush",
    "txmq.broker.schedule",
    "txmq.broker.messaging.read",
    "txmq.broker.processors.pull",
    "txmq.broker.store.reading",
    "txmq.broker.messaging.fastpath",
    "txmq.broker.messaging.fastpath_one",
    "txmq.broker.messaging.fastpath_batch",
    "txmq.broker.messaging.fastpath_forms",
    "txmq.broker.messaging.core",
    "txmq.broker.processors.send",
]

#: Written beside the compiled modules at build time: module name -> SHA-256 of the .py
#: each was compiled from.
MANIFEST_NAME = "_compiled_manifest.json"
#: The native code shared by the compiled modules: one extension module at the top level.
GROUP = "txmq"


def _source(module: str) -> Path:
    return HERE.joinpath(*module.split(".")).with_suffix(".py")


def _extensions() -> list[Any]:
    if os.environ.get("TXMQ_COMPILE", "").strip() != "1":
        return []  # a plain py3-none-any wheel
    from mypyc.build import mypycify

    return mypycify(
        [str(_source(m).relative_to(HERE)) for m in COMPILED],
        opt_level="3",
        debug_level="0",
        group_name=GROUP,
        # one C file per module: they compile in parallel (build_ext below)
        multi_file=True,
    )


def _hashes() -> dict[str, str]:
    return {m: hashlib.sha256(_source(m).read_bytes()).hexdigest() for m in COMPILED}


class BuildExt(build_ext):
    """Writes the manifest beside the compiled modules it describes, once they are all built:
    in the build folder (what a wheel packs) and, built in place (``make install``), beside the
    sources.  A manifest never describes compiled files of another build."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # the C files compile one per core
            self.parallel = os.cpu_count() or 1

    def copy_file(self, infile: str, outfile: str, *args: Any, **kwargs: Any) -> Any:
        # A compiled module copied beside the sources replaces the old file rather than
        # writing into it: a process that has the old one loaded keeps its pages.
        if outfile.endswith(tuple(EXTENSION_SUFFIXES)) and os.path.isfile(outfile):
            os.unlink(outfile)
        return super().copy_file(infile, outfile, *args, **kwargs)

    def run(self) -> None:
        manifest = HERE / "txmq" / MANIFEST_NAME
        if self.inplace and self.extensions:
            manifest.unlink(missing_ok=True)  # until every module is built again
        super().run()
        if not self.extensions:
            return
        text = json.dumps(_hashes(), indent=1, sort_keys=True) + "\n"
        built = Path(self.build_lib) / "txmq" / MANIFEST_NAME
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_text(text)
        if self.inplace:
            manifest.write_text(text)


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})

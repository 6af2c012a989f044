"""Guard the dependency direction: protocol <- broker, protocol <- client <- spark_connector.

An ``ast`` walk over every module's imports (including imports inside functions and
``if TYPE_CHECKING`` blocks), with relative imports resolved to their absolute names.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Source folder -> installed package (txmq/protocol links to protocol/, ...).
PACKAGES = {
    "protocol": "txmq.protocol",
    "broker": "txmq.broker",
    "client": "txmq.client",
    "spark_connector": "txmq.spark_connector",
}


@dataclass(frozen=True)
class Rule:
    """Modules under ``folder`` must not import any module named in ``forbidden`` (or a
    submodule of one)."""

    folder: str
    forbidden: tuple[str, ...]
    why: str
    #: Files or folders under ``folder`` the rule does not apply to.
    exempt: tuple[str, ...] = ()


# The top-level spellings ("client", "broker", ...) are forbidden too: they only resolve when
# running from a checkout and would break an installed package.
RULES = [
    Rule(
        "protocol",
        (
            "txmq.broker",
            "txmq.client",
            "txmq.spark_connector",
            "broker",
            "client",
            "spark_connector",
        ),
        "the protocol is the bottom layer: it imports neither broker, client nor connector",
    ),
    Rule(
        "broker",
        ("txmq.client", "txmq.spark_connector", "client", "spark_connector"),
        "the broker never imports the client",
    ),
    Rule("client", ("txmq.broker", "broker"), "the client never imports the broker"),
    Rule(
        "spark_connector",
        ("txmq.broker", "broker"),
        "the Spark connector builds on the client, never on the broker",
    ),
    Rule(
        "broker",
        ("txmq.broker.server",),
        "only the composition root builds and knows the controller: components get the "
        "context (broker/context.py) or the few members they use, and typed ports "
        "(broker/ports.py) for what points upward",
        exempt=("broker/server.py", "broker/cluster/"),
    ),
    Rule(
        "broker/store",
        ("asyncio", "socket", "uvloop"),
        "the store is synchronous and does no network I/O",
    ),
    Rule(
        "broker/transaction",
        ("txmq.broker.messaging", "txmq.broker.processors", "txmq.broker.grpc"),
        "one direction between the two (docs/architecture.md): the messaging use cases build "
        "on the transaction state machine and its service, never the other way; what the "
        "transaction package needs of them it names in a protocol of its own",
    ),
]


#: Protocol modules that are plain data and pure functions: they import none of these.
IO_MODULES = (
    "asyncio",
    "os",
    "selectors",
    "socket",
    "ssl",
    "subprocess",
    "threading",
    "uvloop",
)
PURE_PROTOCOL_MODULES = ("protocol/topics.py",)


def module_name(path: Path) -> str:
    """The installed dotted name of a source file (``broker/store/x.py`` ->
    ``txmq.broker.store.x``)."""
    rel = path.relative_to(ROOT)
    top, *rest = rel.with_suffix("").parts
    parts = PACKAGES[top].split(".") + rest
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every absolute module name ``source`` imports.  For ``from x import y`` both ``x`` and
    ``x.y`` are reported (``y`` may be a submodule)."""
    tree = ast.parse(source)
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def violations(rule: Rule, imports: set[str]) -> list[str]:
    return sorted(
        name
        for name in imports
        if any(name == f or name.startswith(f + ".") for f in rule.forbidden)
    )


def source_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_every_package_folder_has_sources() -> None:
    for folder, package in PACKAGES.items():
        assert (ROOT / folder / "__init__.py").is_file(), folder
        link = ROOT.joinpath(*package.split("."))
        assert link.resolve() == (ROOT / folder).resolve(), f"{link} is no link to {folder}/"
    assert len(source_files("protocol")) >= 8


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.folder)
def test_layering(rule: Rule) -> None:
    problems = []
    for path in source_files(rule.folder):
        rel = str(path.relative_to(ROOT))
        if any(rel == e or rel.startswith(e) for e in rule.exempt):
            continue
        module = module_name(path)
        imports = imported_modules(
            path.read_text(encoding="utf-8"), module, path.name == "__init__.py"
        )
        for name in violations(rule, imports):
            problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, f"{rule.why}:\n" + "\n".join(problems)


#: The only protocol module that does I/O: the asyncio adapter both sides share.
PROTOCOL_IO_ADAPTER = "protocol/aio.py"
#: What the rest of the protocol package may not import: no network, no event loop, no
#: processes (``os`` and ``threading`` stay allowed for a pid, random bytes and a lock).
NETWORK_MODULES = ("asyncio", "selectors", "socket", "ssl", "subprocess", "uvloop")


@pytest.mark.parametrize(
    "path",
    [
        str(p.relative_to(ROOT))
        for p in source_files("protocol")
        if str(p.relative_to(ROOT)) != PROTOCOL_IO_ADAPTER
    ],
)
def test_the_protocol_does_no_network_io_outside_its_adapter(path: str) -> None:
    source = ROOT / path
    imports = imported_modules(source.read_text(encoding="utf-8"), module_name(source), False)
    bad = violations(Rule(path, NETWORK_MODULES, "sans-IO"), imports)
    assert not bad, f"{path} must stay free of I/O (no name lookups, sockets or loops): {bad}"


@pytest.mark.parametrize("path", PURE_PROTOCOL_MODULES)
def test_pure_protocol_module_does_no_io(path: str) -> None:
    source = ROOT / path
    imports = imported_modules(source.read_text(encoding="utf-8"), module_name(source), False)
    bad = violations(Rule(path, IO_MODULES, "pure"), imports)
    assert not bad, f"{path} must stay free of I/O; it imports {bad}"


# --- the checker itself -----------------------------------------------------------------------


def test_checker_resolves_relative_imports() -> None:
    src = (
        "from ...client import producer\nfrom . import commit_log\nfrom .. import config\n"
        "from ..clients import ClientRegistry\n"
    )
    found = imported_modules(src, "txmq.broker.store.segment", is_package=False)
    assert "txmq.client" in found and "txmq.client.producer" in found
    assert "txmq.broker.clients" in found
    assert "txmq.broker.store.commit_log" in found
    assert "txmq.broker.config" in found
    in_init = imported_modules("from .codes import X\n", "txmq.protocol", is_package=True)
    assert "txmq.protocol.codes" in in_init


def test_checker_finds_violations_anywhere_in_a_module() -> None:
    src = """
import os
def late():
    import txmq.client.producer as p
    from txmq.broker import server
if False:
    import asyncio.events
"""
    found = imported_modules(src, "txmq.protocol.frame", is_package=False)
    protocol_rule, *_ = RULES
    assert violations(protocol_rule, found) == [
        "txmq.broker",
        "txmq.broker.server",
        "txmq.client.producer",
    ]
    store_rule = next(r for r in RULES if r.folder == "broker/store")
    assert violations(store_rule, found) == ["asyncio.events"]


def test_checker_does_not_confuse_prefixes() -> None:
    found = imported_modules(
        "import txmq.clientele\nimport sockets_lib\n", "txmq.broker.x", is_package=False
    )
    assert violations(RULES[1], found) == []
    store_rule = next(r for r in RULES if r.folder == "broker/store")
    assert violations(store_rule, found) == []


# --- no import cycles in the broker -------------------------------------------------------------


def packages_run_by(importer: str, imported: str) -> list[str]:
    """The packages whose ``__init__`` an import of ``imported`` runs, seen from ``importer``:
    every package above ``imported`` but ``importer`` and those above it (which ran first)."""
    parts = imported.split(".")
    above = (".".join(parts[:i]) for i in range(1, len(parts)))
    return [pkg for pkg in above if pkg != importer and not importer.startswith(pkg + ".")]


def import_graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of ``folder`` it imports (imports inside functions and
    TYPE_CHECKING blocks count), and the packages whose ``__init__`` those imports run: an
    import of ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, an edge of its own."""
    modules = {module_name(p): p for p in source_files(folder) if "/v2/" not in str(p)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = imported_modules(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        # The packages above ``name`` ran before it: importing one (``from . import x``) adds
        # no edge.
        edges = {m for m in found if m in modules and not name.startswith(m + ".")}
        for m in list(edges):
            edges.update(pkg for pkg in packages_run_by(name, m) if pkg in modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def import_cycles(folder: str) -> list[list[str]]:
    """The import cycles among the modules of ``folder`` (strongly connected components of
    more than one module, over :func:`import_graph`'s edges)."""
    graph = import_graph(folder)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_the_broker_has_no_import_cycles() -> None:
    cycles = import_cycles("broker")
    assert not cycles, "modules of the broker import each other: " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "broker"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n"
    )
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert import_cycles("broker") == [["txmq.broker.a", "txmq.broker.b"]]


def test_the_cycle_finder_counts_the_edges_through_a_package_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``transaction/service.py`` importing ``messaging/fastpath.py`` runs
    ``messaging/__init__.py`` first; when that imports ``messaging/core.py``, which imports
    the transaction service, the three form a cycle (a type-only import in the ``__init__``
    counts, as everywhere)."""
    pkg = tmp_path / "broker"
    for d in (pkg, pkg / "messaging", pkg / "transaction"):
        d.mkdir()
        (d / "__init__.py").write_text("")
    (pkg / "messaging" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import Core\n"
    )
    (pkg / "messaging" / "core.py").write_text(
        "from . import fastpath\nfrom ..transaction.service import Service\n"
    )
    (pkg / "messaging" / "fastpath.py").write_text("")
    (pkg / "transaction" / "service.py").write_text("from ..messaging.fastpath import F\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert import_cycles("broker") == [
        ["txmq.broker.messaging", "txmq.broker.messaging.core", "txmq.broker.transaction.service"]
    ]
    # The fix: the transaction service imports nothing of messaging.
    (pkg / "transaction" / "service.py").write_text("")
    assert import_cycles("broker") == []


def test_an_import_runs_only_the_packages_not_yet_run() -> None:
    assert packages_run_by("txmq.broker.transaction.service", "txmq.broker.messaging.fastpath") == [
        "txmq.broker.messaging"
    ]
    assert packages_run_by("txmq.broker.messaging.core", "txmq.broker.messaging.fastpath") == []
    assert packages_run_by("txmq.broker.server", "txmq.broker.messaging.core") == [
        "txmq.broker.messaging"
    ]
    assert packages_run_by("txmq.broker", "txmq.broker.store.x") == ["txmq.broker.store"]


def test_every_test_module_has_its_own_name() -> None:
    """pytest imports test modules by their base name (the test folders are no packages): two
    files of one name stop the whole suite at collection."""
    seen: dict[str, Path] = {}
    twice = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            twice.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not twice, f"test modules of the same name: {twice}"

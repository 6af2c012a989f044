"""The shape of the ``txmq`` command line: every command that prints a result can print it as
JSON (``-o json``), and the CLI package stays readable (a module per command group, none over
1,000 lines, no function over 80 without a line saying why).  The broker is held to the same
limits."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import click

from txmq.cli import main

CLI_DIR = Path(__file__).resolve().parent.parent / "txmq" / "cli"
BROKER_DIR = Path(__file__).resolve().parent.parent / "broker"

#: Commands without ``-o/--output``, and why: they serve or answer with their exit status
#: (``txmq console`` serves too: a group, its own subcommands aside).
NO_OUTPUT_OPTION = {
    "broker": "serves a broker until stopped; --print-config prints JSON already",
    "probe": "a health check: its exit status is the answer, the text the operations port's",
}

MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 80

#: Generated code under broker/ (the gRPC stubs): not held to the limits.
BROKER_GENERATED = ("grpc/vendor/v2/",)
#: Broker modules still over :data:`MAX_MODULE_LINES`, to be split (then taken off).
BROKER_OVER_LIMIT: set[str] = set()
#: Every package of the product (what ``txmq`` installs), held to :data:`MAX_MODULE_LINES`.
PACKAGES = ("broker", "client", "protocol", "spark_connector", "txmq")
#: Broker functions still over :data:`MAX_FUNCTION_LINES` with no line saying why (module and
#: name), to be split or commented (then taken off).
BROKER_LONG_FUNCTIONS: set[str] = set()


def leaves(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    """``("topic create", command)`` for every command that is no group, depth first."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        if isinstance(cmd, click.Group):
            yield from leaves(cmd, (*path, name))
        else:
            yield " ".join((*path, name)), cmd


def test_the_tree_has_every_command_group() -> None:
    names = {name for name, _ in leaves(main)}
    assert len(names) >= 40, sorted(names)
    for name in ("topic create", "group delete", "txn commit", "acl user create", "trace"):
        assert name in names


def test_every_command_that_prints_a_result_takes_output() -> None:
    missing = []
    for name, cmd in leaves(main):
        outputs = [p for p in cmd.params if isinstance(p, click.Option) and "--output" in p.opts]
        if name in NO_OUTPUT_OPTION:
            assert not outputs, f"{name} has --output now: take it off the allowlist"
            continue
        if not outputs:
            missing.append(name)
            continue
        (option,) = outputs
        assert "-o" in option.opts, name
        assert isinstance(option.type, click.Choice), name
        assert set(option.type.choices) == {"table", "json"}, name
    assert not missing, f"commands without -o/--output table|json: {missing}"


def _long_functions(path: Path) -> Iterator[tuple[str, int]]:
    """``(name, lines)`` of each function longer than the limit whose ``def`` line (or the
    line above it and its decorators) carries no comment saying why."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length <= MAX_FUNCTION_LINES:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        said = lines[first - 2].lstrip().startswith("#") or "#" in lines[node.lineno - 1]
        if not said:
            yield f"{path.name}:{node.lineno} {node.name}", length


def test_the_cli_modules_stay_readable() -> None:
    modules = sorted(CLI_DIR.glob("*.py"))
    assert len(modules) >= 10, "the CLI is a package with a module per command group"
    for path in modules:
        count = len(path.read_text(encoding="utf-8").splitlines())
        assert count <= MAX_MODULE_LINES, f"{path.name}: {count} lines"
    long = [f"{where} ({n} lines)" for path in modules for where, n in _long_functions(path)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines, no comment saying why: {long}"


def test_the_broker_modules_stay_readable() -> None:
    modules = [
        path
        for path in sorted(BROKER_DIR.rglob("*.py"))
        if not path.relative_to(BROKER_DIR).as_posix().startswith(BROKER_GENERATED)
    ]
    assert len(modules) >= 50, "the broker's modules are found"
    over, long = [], []
    for path in modules:
        rel = path.relative_to(BROKER_DIR).as_posix()
        count = len(path.read_text(encoding="utf-8").splitlines())
        if (count > MAX_MODULE_LINES) != (rel in BROKER_OVER_LIMIT):
            over.append(f"{rel}: {count} lines")
        for where, n in _long_functions(path):
            key = f"{rel} {where.split()[1]}"
            if key not in BROKER_LONG_FUNCTIONS:
                long.append(f"{rel}:{where.split(':', 1)[1]} ({n} lines)")
    assert not over, f"over {MAX_MODULE_LINES} lines (or split: take it off the list): {over}"
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines, no comment saying why: {long}"
    found = {
        f"{path.relative_to(BROKER_DIR).as_posix()} {where.split()[1]}"
        for path in modules
        for where, _ in _long_functions(path)
    }
    assert BROKER_LONG_FUNCTIONS <= found, (
        f"no longer long, take them off the list: {sorted(BROKER_LONG_FUNCTIONS - found)}"
    )


def test_no_module_of_the_product_is_over_the_limit() -> None:
    root = BROKER_DIR.parent
    over = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("broker/grpc/vendor/v2/") or path.is_symlink():
                continue
            count = len(path.read_text(encoding="utf-8").splitlines())
            if count > MAX_MODULE_LINES and rel.removeprefix("broker/") not in BROKER_OVER_LIMIT:
                over.append(f"{rel}: {count} lines")
    assert not over, f"over {MAX_MODULE_LINES} lines: {over}"

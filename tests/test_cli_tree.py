"""The shape of the ``txmq`` command line: the CLI package stays readable (a module per command
group, none over 1,000 lines, no function over 80 without a line saying why)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import click

from txmq.cli import main

CLI_DIR = Path(__file__).resolve().parent.parent / "txmq" / "cli"

MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 80


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

"""The SDK's API reference, generated from its docstrings with pdoc (a dev dependency):
``python -m txmq.apidocs [OUTPUT]`` (``make api-docs``) writes HTML for ``txmq.client`` and each
of its public modules into OUTPUT (default ``build/api``).

The build fails when pdoc reports a problem with a docstring or an annotation (a name it cannot
resolve, a malformed section), so the reference stays as complete as the code.
"""

from __future__ import annotations

import pkgutil
import sys
import warnings
from pathlib import Path

#: The package documented.
PACKAGE = "txmq.client"
#: Its modules left out: internals without a public API of their own.
PRIVATE = frozenset({"bridge", "console"})


def modules() -> list[str]:
    """``txmq.client`` and its public modules, by import name."""
    import txmq.client as client

    names = [PACKAGE]
    exported = set(client.__all__)  # pdoc documents these with the package already
    for info in pkgutil.iter_modules(client.__path__):
        if not info.name.startswith("_") and info.name not in PRIVATE | exported:
            names.append(f"{PACKAGE}.{info.name}")
    return names


def build(output: Path) -> list[str]:
    """Write the HTML reference into ``output``; the problems pdoc reported (none: a clean
    build)."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", search=True, show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*modules(), output_directory=output)
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    output = Path(args[0] if args else "build/api")
    problems = build(output)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"API reference written to {output / 'index.html'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

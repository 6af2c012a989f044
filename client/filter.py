"""SQL92 property filters on the consumer side: ``sql("a > 5 AND region = 'eu'")`` in place of
a tag expression (RocketMQ's ``MessageSelector.bySql``).

The broker compiles and evaluates the expression (see docs/sdk.md for the grammar); the SDK
only marks it, so heartbeats and pulls carry ``expressionType: SQL92``.
"""

from __future__ import annotations

__all__ = ["SqlExpression", "sql"]


class SqlExpression(str):
    """A SQL92 filter expression: a ``str`` (so it goes wherever a tag expression goes) that
    the consumers send as ``expressionType: SQL92``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"sql({str.__repr__(self)})"


def sql(expression: str) -> SqlExpression:
    """Mark ``expression`` as a SQL92 property filter, e.g.
    ``consumer.subscribe("orders", sql("amount > 100 AND region = 'eu'"), on_message)``.

    Raises:
        ValueError: the expression is empty (the broker checks the rest when the consumer
            starts, or at the first pull of a pull consumer).
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("a SQL92 filter expression must be a non-empty string")
    return SqlExpression(expression.strip())

"""SQL92 property filters (RocketMQ's ``MessageSelector.bySql``): the grammar of RocketMQ's
``SelectorParser.jj`` parsed by lark, compiled once into closures over a message's properties.

The variables are the message's properties (user properties and ``TAGS``), all strings.
Semantics follow RocketMQ's filter module:

* a missing property is NULL: a comparison with it is NULL (three-valued AND / OR / NOT), and a
  filter matches only when the whole expression is TRUE;
* a property compared to a number is converted to one; a value that is not a number makes the
  comparison FALSE;
* ``>``, ``>=``, ``<``, ``<=`` and ``BETWEEN`` take numbers (a string or boolean literal there is
  refused when the expression is compiled); ``IN`` and ``CONTAINS`` / ``STARTSWITH`` /
  ``ENDSWITH`` take string literals;
* ``=`` and ``<>`` between a property and a string literal compare strings; with ``TRUE`` /
  ``FALSE`` the property is read as Java's ``Boolean.valueOf`` does (``true``, any case).

Why lark: the grammar is written once as a grammar (LALR(1), as RocketMQ's JavaCC one), the
lexer's positions go into the error a client sees, and there is no hand-written parser to keep.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable
from typing import Any

from lark import Lark, Token, Transformer, UnexpectedCharacters, UnexpectedInput
from lark.exceptions import VisitError

from txmq.protocol.errors import ProtocolError
from txmq.protocol.message import FIXED_SIZE, string_to_properties, topic_span

__all__ = [
    "SUBSCRIPTION_PARSE_FAILED",
    "SqlFilter",
    "SqlFilterError",
    "StoredFilter",
    "compile_sql",
    "stored_properties",
]

Props = dict[str, str]
#: A compiled node: properties -> value (None is SQL's NULL).
Fn = Callable[[Props], Any]


class SqlFilterError(ValueError):
    """The expression is not valid RocketMQ SQL92; the message says where and why."""


_GRAMMAR = r"""
start: or_expr

?or_expr: and_expr
    | or_expr _OR and_expr                              -> or_
?and_expr: eq_expr
    | and_expr _AND eq_expr                             -> and_
?eq_expr: cmp_expr
    | eq_expr "=" cmp_expr                              -> eq
    | eq_expr "<>" cmp_expr                             -> ne
    | eq_expr _IS _NULL                                 -> is_null
    | eq_expr _IS _NOT _NULL                            -> is_not_null
?cmp_expr: unary
    | cmp_expr ">" unary                                -> gt
    | cmp_expr ">=" unary                               -> ge
    | cmp_expr "<" unary                                -> lt
    | cmp_expr "<=" unary                               -> le
    | cmp_expr _CONTAINS STRING                         -> contains
    | cmp_expr _NOT _CONTAINS STRING                    -> not_contains
    | cmp_expr _STARTSWITH STRING                       -> startswith
    | cmp_expr _NOT _STARTSWITH STRING                  -> not_startswith
    | cmp_expr _ENDSWITH STRING                         -> endswith
    | cmp_expr _NOT _ENDSWITH STRING                    -> not_endswith
    | cmp_expr _BETWEEN unary _AND unary                -> between
    | cmp_expr _NOT _BETWEEN unary _AND unary           -> not_between
    | cmp_expr _IN "(" STRING ("," STRING)* ")"         -> in_
    | cmp_expr _NOT _IN "(" STRING ("," STRING)* ")"    -> not_in
?unary: primary
    | "+" unary
    | "-" unary                                         -> neg
    | _NOT unary                                        -> not_
?primary: STRING                                        -> string
    | DECIMAL                                           -> decimal
    | FLOAT                                             -> float_
    | _TRUE                                             -> true
    | _FALSE                                            -> false
    | _NULL                                             -> null
    | ID                                                -> variable
    | "(" or_expr ")"

_NOT: "NOT"i
_AND: "AND"i
_OR: "OR"i
_BETWEEN: "BETWEEN"i
_IN: "IN"i
_TRUE: "TRUE"i
_FALSE: "FALSE"i
_NULL: "NULL"i
_IS: "IS"i
_CONTAINS: "CONTAINS"i
_STARTSWITH: "STARTSWITH"i
_ENDSWITH: "ENDSWITH"i

FLOAT.2: /[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?/ | /\.[0-9]+([eE][+-]?[0-9]+)?/ | /[0-9]+[eE][+-]?[0-9]+/
DECIMAL: /(0|[1-9][0-9]*)[lL]?/
STRING: /'(''|[^'])*'/
ID: /[a-zA-Z_$][a-zA-Z0-9_$]*/

LINE_COMMENT: /--[^\n\r]*(\r\n|\n|\r)/
BLOCK_COMMENT: /\/\*(.|\n)*?\*\//
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
%ignore /[ \t\n\r\f]+/
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", maybe_placeholders=False)

#: What a numeric property value may look like (Java's Long / Double forms, no Python extras
#: such as ``1_000``, ``nan`` or surrounding spaces).
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")

#: A conversion that failed: the comparison is FALSE (not NULL), as in RocketMQ.
_NOT_A_NUMBER = object()


def _as_number(s: str) -> Any:
    if _INTEGER.fullmatch(s):
        return int(s)
    if _NUMBER.fullmatch(s):
        return float(s)
    return _NOT_A_NUMBER


class _Node:
    """A compiled expression node: ``fn`` and what is known of it when compiled."""

    __slots__ = ("fn", "kind", "const", "name")

    def __init__(self, fn: Fn, kind: str, const: Any = None, name: str | None = None) -> None:
        self.fn = fn
        #: "bool" (a boolean expression), "var" (a property), "const" (a literal), "num"
        #: (a numeric expression, e.g. a negated property)
        self.kind = kind
        self.const = const
        self.name = name


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _numbers_alike(lv: Any, rv: Any) -> tuple[Any, Any]:
    """A string compared with a number is read as a number (``_NOT_A_NUMBER`` when it is not
    one), as RocketMQ converts property values."""
    if isinstance(lv, str) and _is_number(rv):
        return _as_number(lv), rv
    if isinstance(rv, str) and _is_number(lv):
        return lv, _as_number(rv)
    return lv, rv


def _ordered(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    """``op`` over two evaluated operands with RocketMQ's conversions (NULL in, NULL out)."""

    def compare(lv: Any, rv: Any) -> Any:
        if lv is None or rv is None:
            return None
        lv, rv = _numbers_alike(lv, rv)
        if lv is _NOT_A_NUMBER or rv is _NOT_A_NUMBER:
            return False
        if (_is_number(lv) and _is_number(rv)) or (isinstance(lv, str) and isinstance(rv, str)):
            return op(lv, rv)
        return False

    return compare


def _equal(lv: Any, rv: Any) -> Any:
    if lv is None or rv is None:
        return None
    if isinstance(lv, bool) and isinstance(rv, str):
        return lv == (rv.lower() == "true")
    if isinstance(rv, bool) and isinstance(lv, str):
        return rv == (lv.lower() == "true")
    lv, rv = _numbers_alike(lv, rv)
    if lv is _NOT_A_NUMBER or rv is _NOT_A_NUMBER:
        return False
    if isinstance(lv, bool) != isinstance(rv, bool):
        return False
    return lv == rv


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
}


_SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _unquote(tok: Token) -> str:
    return str(tok)[1:-1].replace("''", "'")


def _describe(n: _Node) -> str:
    if n.kind == "var":
        return str(n.name)
    if n.kind == "const":
        return "NULL" if n.const is None else repr(n.const)
    return "expression"


class _Compile(Transformer[Token, _Node]):
    """Tree -> closures; the checks RocketMQ's parser makes are made here, once."""

    # -- leaves ---------------------------------------------------------------------------------

    def string(self, items: list[Token]) -> _Node:
        v = _unquote(items[0])
        return _Node(lambda p: v, "const", v)

    def decimal(self, items: list[Token]) -> _Node:
        v = int(str(items[0]).rstrip("lL"))
        return _Node(lambda p: v, "const", v)

    def float_(self, items: list[Token]) -> _Node:
        v = float(str(items[0]))
        return _Node(lambda p: v, "const", v)

    def true(self, items: list[Token]) -> _Node:
        return _Node(lambda p: True, "const", True)

    def false(self, items: list[Token]) -> _Node:
        return _Node(lambda p: False, "const", False)

    def null(self, items: list[Token]) -> _Node:
        return _Node(lambda p: None, "const", None)

    def variable(self, items: list[Token]) -> _Node:
        name = str(items[0])

        def fn(p: Props) -> Any:
            return p.get(name)

        return _Node(fn, "var", name=name)

    # -- unary ----------------------------------------------------------------------------------

    def neg(self, items: list[_Node]) -> _Node:
        (x,) = items
        if x.kind == "const":
            if not _is_number(x.const):
                raise SqlFilterError(f"cannot negate {_describe(x)}: not a number")
            v = -x.const
            return _Node(lambda p: v, "const", v)
        f = x.fn

        def fn(p: Props) -> Any:
            v = f(p)
            if v is None:
                return None
            if isinstance(v, str):
                v = _as_number(v)
            return -v if _is_number(v) else None

        return _Node(fn, "num")

    def not_(self, items: list[_Node]) -> _Node:
        f = self._boolean(items[0]).fn

        def fn(p: Props) -> Any:
            v = f(p)
            return None if v is None else not v

        return _Node(fn, "bool")

    # -- logic ----------------------------------------------------------------------------------

    def _boolean(self, n: _Node) -> _Node:
        if n.kind == "bool" or (n.kind == "const" and isinstance(n.const, bool)):
            return n
        if n.kind == "var":  # a property read as a boolean: only a boolean value is one
            return _Node(lambda p: None, "bool")
        raise SqlFilterError(f"expression will not result in a boolean value: {_describe(n)}")

    def and_(self, items: list[_Node]) -> _Node:
        return self._junction(items, decisive=False)

    def or_(self, items: list[_Node]) -> _Node:
        return self._junction(items, decisive=True)

    def _junction(self, items: list[_Node], *, decisive: bool) -> _Node:
        """AND (``decisive`` False) or OR (True) in SQL's three-valued logic: one side equal
        to ``decisive`` decides; else NULL if a side is NULL; else ``not decisive``."""
        lf, rf = (self._boolean(x).fn for x in items)
        otherwise = not decisive

        def fn(p: Props) -> Any:
            lv = lf(p)
            if lv is decisive:
                return decisive
            rv = rf(p)
            if rv is decisive:
                return decisive
            return None if lv is None or rv is None else otherwise

        return _Node(fn, "bool")

    # -- comparisons ----------------------------------------------------------------------------

    def _ordering(self, op: str, left: _Node, right: _Node) -> _Node:
        for n in (left, right):
            if n.kind == "const" and not _is_number(n.const):
                raise SqlFilterError(f"value {_describe(n)} cannot be compared with {_SYMBOLS[op]}")
            if n.kind == "bool":
                raise SqlFilterError(f"a boolean expression cannot be compared with {_SYMBOLS[op]}")
        test = _OPS[op]
        if left.kind == "var" and right.kind == "const":
            # The common shape, ``prop > 5``: one dict lookup and one conversion.
            name, c = left.name, right.const

            def fast(p: Props) -> Any:
                s = p.get(name)  # type: ignore[arg-type]
                if s is None:
                    return None
                v = _as_number(s)
                return False if v is _NOT_A_NUMBER else test(v, c)

            return _Node(fast, "bool")
        compare = _ordered(test)
        lf, rf = left.fn, right.fn
        return _Node(lambda p: compare(lf(p), rf(p)), "bool")

    def gt(self, items: list[_Node]) -> _Node:
        return self._ordering("gt", *items)

    def ge(self, items: list[_Node]) -> _Node:
        return self._ordering("ge", *items)

    def lt(self, items: list[_Node]) -> _Node:
        return self._ordering("lt", *items)

    def le(self, items: list[_Node]) -> _Node:
        return self._ordering("le", *items)

    def _equality(self, left: _Node, right: _Node, negate: bool) -> _Node:
        for n in (left, right):
            if n.kind == "const" and n.const is None:
                raise SqlFilterError("NULL cannot be compared with = or <>: use IS NULL")
        if left.kind == "var" and right.kind == "const" and isinstance(right.const, str):
            name, c = left.name, right.const

            def fast(p: Props) -> Any:
                s = p.get(name)  # type: ignore[arg-type]
                if s is None:
                    return None
                return (s != c) if negate else (s == c)

            return _Node(fast, "bool")
        lf, rf = left.fn, right.fn
        if negate:

            def ne(p: Props) -> Any:
                v = _equal(lf(p), rf(p))
                return None if v is None else not v

            return _Node(ne, "bool")
        return _Node(lambda p: _equal(lf(p), rf(p)), "bool")

    def eq(self, items: list[_Node]) -> _Node:
        return self._equality(items[0], items[1], False)

    def ne(self, items: list[_Node]) -> _Node:
        return self._equality(items[0], items[1], True)

    def is_null(self, items: list[_Node]) -> _Node:
        f = items[0].fn
        return _Node(lambda p: f(p) is None, "bool")

    def is_not_null(self, items: list[_Node]) -> _Node:
        f = items[0].fn
        return _Node(lambda p: f(p) is not None, "bool")

    def _between(self, items: list[Any], negate: bool) -> _Node:
        x, lo, hi = items
        both = self.and_([self._ordering("ge", x, lo), self._ordering("le", x, hi)])
        return self.not_([both]) if negate else both

    def between(self, items: list[Any]) -> _Node:
        return self._between(items, False)

    def not_between(self, items: list[Any]) -> _Node:
        return self._between(items, True)

    def _in(self, items: list[Any], negate: bool) -> _Node:
        values = frozenset(_unquote(t) for t in items[1:])
        return self._string_predicate(items[0], values.__contains__, negate)

    def in_(self, items: list[Any]) -> _Node:
        return self._in(items, False)

    def not_in(self, items: list[Any]) -> _Node:
        return self._in(items, True)

    def _string_test(
        self, items: list[Any], test: Callable[[str, str], bool], negate: bool
    ) -> _Node:
        lit = _unquote(items[1])
        return self._string_predicate(items[0], lambda v: test(v, lit), negate)

    @staticmethod
    def _string_predicate(x: _Node, pred: Callable[[str], bool], negate: bool) -> _Node:
        """``pred`` of a string value (negated with ``negate``); NULL stays NULL, a value that
        is not a string does not match."""
        f = x.fn

        def fn(p: Props) -> Any:
            v = f(p)
            if v is None:
                return None
            if not isinstance(v, str):
                return False
            return pred(v) != negate

        return _Node(fn, "bool")

    def start(self, items: list[_Node]) -> _Node:
        return self._boolean(items[0])


def _string_rule(test: Callable[[str, str], bool], negate: bool) -> Callable[..., _Node]:
    def rule(self: _Compile, items: list[Any]) -> _Node:
        return self._string_test(items, test, negate)

    return rule


#: RocketMQ 5's string tests: the grammar rule each is parsed as, the test, and whether the
#: rule is its NOT form.  Each becomes the compiler's method of that rule's name.
_STRING_TESTS: tuple[tuple[str, Callable[[str, str], bool], bool], ...] = (
    ("contains", str.__contains__, False),
    ("not_contains", str.__contains__, True),
    ("startswith", str.startswith, False),
    ("not_startswith", str.startswith, True),
    ("endswith", str.endswith, False),
    ("not_endswith", str.endswith, True),
)
for _rule, _test, _negate in _STRING_TESTS:
    setattr(_Compile, _rule, _string_rule(_test, _negate))


class SqlFilter:
    """A compiled SQL92 expression: :meth:`matches` over a property map, :meth:`matches_stored`
    over a stored message record."""

    __slots__ = ("expression", "_fn")

    def __init__(self, expression: str, fn: Fn) -> None:
        self.expression = expression
        self._fn = fn

    def matches(self, props: Props) -> bool:
        """True only when the expression is TRUE (FALSE and NULL do not match)."""
        return self._fn(props) is True

    def matches_stored(self, record: bytes | memoryview) -> bool:
        """:meth:`matches` over the properties of a stored message record (a record whose
        properties cannot be read matches nothing)."""
        try:
            props = stored_properties(record)
        except (struct.error, IndexError, UnicodeDecodeError, ProtocolError):
            return False
        return self._fn(props) is True

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def _error_message(expression: str, exc: UnexpectedInput) -> str:
    col = getattr(exc, "column", "?")
    if isinstance(exc, UnexpectedCharacters):
        what = f"unexpected character {exc.char!r}"
    else:
        tok = getattr(exc, "token", None)
        if tok is None or tok.type == "$END":
            what = "unexpected end of expression"
        else:
            what = f"unexpected token {str(tok)!r}"
    return f"{what} at line {getattr(exc, 'line', '?')}, column {col}"


@functools.lru_cache(maxsize=4096)
def compile_sql(expression: str) -> SqlFilter:
    """Compile ``expression`` (cached: each distinct expression is parsed once).

    Raises:
        SqlFilterError: the expression is empty or not valid; the message says where.
    """
    if not expression or not expression.strip():
        raise SqlFilterError("Invalid MessageSelector: the expression is empty")
    too_deep = SqlFilterError(f"Invalid MessageSelector: nested too deeply in {expression!r}")
    try:
        tree = _PARSER.parse(expression)
    except UnexpectedInput as exc:
        raise SqlFilterError(
            f"Invalid MessageSelector: {_error_message(expression, exc)} in {expression!r}"
        ) from None
    except RecursionError:
        raise too_deep from None
    try:
        node = _Compile().transform(tree)
    except RecursionError:
        raise too_deep from None
    except VisitError as exc:
        cause = exc.orig_exc
        if isinstance(cause, SqlFilterError):
            raise SqlFilterError(f"Invalid MessageSelector: {cause} in {expression!r}") from None
        if isinstance(cause, RecursionError):
            raise too_deep from None
        raise
    return SqlFilter(expression, node.fn)


_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_BODY_LEN_AT = FIXED_SIZE - 4


def stored_properties(record: bytes | memoryview) -> Props:
    """The properties of one stored message record (the layout of
    :func:`txmq.protocol.message.encode_message`), without decoding the rest."""
    (magic,) = _I32.unpack_from(record, 4)
    (body_len,) = _I32.unpack_from(record, _BODY_LEN_AT)
    p, tlen = topic_span(record, FIXED_SIZE + body_len, magic)
    p += tlen
    (plen,) = _I16.unpack_from(record, p)
    p += 2
    return string_to_properties(str(record[p : p + plen], "utf-8"))


#: RocketMQ's ResponseCode.SUBSCRIPTION_PARSE_FAILED: the answer to an expression that does not
#: compile (CHECK_CLIENT_CONFIG, PULL_MESSAGE).
SUBSCRIPTION_PARSE_FAILED = 23

#: A filter over stored message records, as the store's reads take it.
StoredFilter = Callable[[bytes], bool]

"""The SQL92 filter grammar and its evaluation: RocketMQ's examples, its errors, and generated
expressions over generated property maps checked against a small reference evaluator written
straight in Python (three-valued logic, numbers converted, NULL for a missing property)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.broker.sql_filter import SqlFilterError, compile_sql, stored_properties
from txmq.protocol.message import MessageExt, encode_message

# -- RocketMQ's examples ----------------------------------------------------------------------

PROPS = {"a": "3", "b": "abc", "c": "10.5", "TAGS": "TagA", "region": "eu", "flag": "true"}

CASES = [
    ("a = 3", True),
    ("a = 3.0", True),
    ("a <> 3", False),
    ("a > 2", True),
    ("a >= 3", True),
    ("a < 3", False),
    ("a <= 3", True),
    ("c > 10", True),
    ("c between 10 and 11", True),
    ("a BETWEEN 4 AND 10", False),
    ("a NOT BETWEEN 4 AND 10", True),
    ("b = 'abc'", True),
    ("b <> 'abc'", False),
    ("b in ('abc', 'def')", True),
    ("b not in ('abc', 'def')", False),
    ("TAGS in ('TagA', 'TagB')", True),
    ("a is not null and a > 0 and a between 1 and 10", True),
    ("missing is null", True),
    ("missing is not null", False),
    ("missing > 1", False),
    ("not (missing > 1)", False),  # NOT NULL is NULL: no match
    ("missing = 'x' or a = 3", True),
    ("missing = 'x' and a = 3", False),
    ("not (missing = 'x' and a = 5)", True),  # NULL AND FALSE is FALSE
    ("b > 1", False),  # not a number: FALSE
    ("not (b > 1)", True),
    ("b = 1", False),
    ("b <> 1", True),  # <> is NOT (=): a value that is not a number is not equal to one
    ("b contains 'bc'", True),
    ("b not contains 'bc'", False),
    ("b startswith 'ab'", True),
    ("b endswith 'bc'", True),
    ("b NOT STARTSWITH 'x'", True),
    ("region = 'eu' AND (a > 5 OR c > 10)", True),
    ("flag = TRUE", True),
    ("flag = false", False),
    ("TRUE", True),
    ("FALSE OR a = 3", True),
    ("a > -1", True),
    ("-a < 0", True),
    ("a = 3L", True),
    ("c > 1.05E1", False),
    ("c >= .5e1", True),
    ("b = 'it''s'", False),
    ("a = 3 -- a comment\n", True),
    ("/* block */ a = 3", True),
    ("A = 3", False),  # names are case-sensitive
    ("a IN ('3')", True),
]


@pytest.mark.parametrize(("expression", "expected"), CASES)
def test_rocketmq_examples(expression: str, expected: bool) -> None:
    assert compile_sql(expression).matches(PROPS) is expected


def test_quotes_inside_string_literals() -> None:
    assert compile_sql("b = 'it''s'").matches({"b": "it's"})


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("a >", "unexpected end of expression at line 1, column 3"),
        ("a > 'x'", "'x' cannot be compared with >"),
        ("a between 'x' and 2", "cannot be compared with >="),
        ("a = NULL", "use IS NULL"),
        ("5", "will not result in a boolean value"),
        ("a ## b", "unexpected character '#' at line 1, column 3"),
        ("", "empty"),
        ("a in (1)", "unexpected token '1' at line 1, column 7"),
        ("a and", "unexpected end of expression"),
        ("(a = 1", "unexpected end of expression"),
        ("a = 1)", "unexpected token ')'"),
        ("a contains 5", "unexpected token '5'"),
        ("a = 'unterminated", "unexpected character"),
    ],
)
def test_invalid_expressions_say_what_and_where(expression: str, message: str) -> None:
    with pytest.raises(SqlFilterError) as err:
        compile_sql(expression)
    assert message in str(err.value)
    assert str(err.value).startswith("Invalid MessageSelector")


def test_keywords_are_case_insensitive_and_compiled_once() -> None:
    f = compile_sql("a Is Not Null AnD b iN ('abc')")
    assert f.matches(PROPS)
    assert compile_sql("a Is Not Null AnD b iN ('abc')") is f


def test_properties_read_from_a_stored_record() -> None:
    for topic in ("t", "x" * 200):
        m = MessageExt(topic=topic, body=b"\x00" * 1024)
        m.properties.update({"a": "7", "region": "eu", "TAGS": "TagA"})
        record = encode_message(m)
        assert stored_properties(record) == {"a": "7", "region": "eu", "TAGS": "TagA"}
        assert compile_sql("a > 5 AND region = 'eu' AND TAGS = 'TagA'").matches_stored(record)
        assert not compile_sql("a > 7").matches_stored(record)
        assert not compile_sql("a IS NULL").matches_stored(record[:100])  # cut short


# -- generated expressions against a reference ------------------------------------------------

NAMES = ("a", "b", "c")
STRINGS = ("eu", "us", "x y", "")
VALUES = st.one_of(
    st.integers(-20, 20).map(str), st.sampled_from(STRINGS), st.just("2.5"), st.just("1e1")
)


@dataclass(frozen=True)
class Node:
    """A generated expression: its SQL text and a reference evaluation."""

    text: str
    op: str
    args: tuple[Any, ...]


def ref(n: Node, p: dict[str, str]) -> bool | None:
    """The reference: SQL's three-valued logic, written out case by case."""
    op, args = n.op, n.args

    def num(name: str) -> float | None | str:
        if name not in p:
            return None
        try:
            return float(p[name])
        except ValueError:
            return "NaN"  # not a number: the comparison is FALSE

    if op in ("<", "<=", ">", ">=", "=n", "<>n"):
        name, k = args
        v = num(name)
        if v is None:
            return None
        if v == "NaN":  # not a number: not equal, and no order
            return op == "<>n"
        assert isinstance(v, float)
        return bool(
            {
                "<": v < k,
                "<=": v <= k,
                ">": v > k,
                ">=": v >= k,
                "=n": v == k,
                "<>n": v != k,
            }[op]
        )
    if op in ("=s", "<>s"):
        name, s = args
        if name not in p:
            return None
        return bool(p[name] == s) if op == "=s" else bool(p[name] != s)
    if op == "in":
        name, values = args
        return None if name not in p else p[name] in values
    if op == "between":
        name, lo, hi = args
        v = num(name)
        if v is None:
            return None
        if v == "NaN":
            return False
        assert isinstance(v, float)
        return bool(lo <= v <= hi)
    if op == "isnull":
        return args[0] not in p
    if op == "not":
        r = ref(args[0], p)
        return None if r is None else not r
    if op == "and":
        lv, rv = ref(args[0], p), ref(args[1], p)
        if lv is False or rv is False:
            return False
        return None if lv is None or rv is None else True
    if op == "or":
        lv, rv = ref(args[0], p), ref(args[1], p)
        if lv is True or rv is True:
            return True
        return None if lv is None or rv is None else False
    raise AssertionError(op)


names = st.sampled_from(NAMES)
ints = st.integers(-20, 20)


def quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


leaves = st.one_of(
    st.builds(
        lambda name, op, k: Node(f"{name} {op} {k}", op, (name, k)),
        names,
        st.sampled_from(["<", "<=", ">", ">="]),
        ints,
    ),
    st.builds(lambda name, k: Node(f"{name} = {k}", "=n", (name, k)), names, ints),
    st.builds(lambda name, k: Node(f"{name} <> {k}", "<>n", (name, k)), names, ints),
    st.builds(
        lambda name, s: Node(f"{name} = {quote(s)}", "=s", (name, s)),
        names,
        st.sampled_from(STRINGS),
    ),
    st.builds(
        lambda name, s: Node(f"{name} <> {quote(s)}", "<>s", (name, s)),
        names,
        st.sampled_from(STRINGS),
    ),
    st.builds(
        lambda name, vs: Node(
            f"{name} IN ({', '.join(quote(v) for v in vs)})", "in", (name, frozenset(vs))
        ),
        names,
        st.lists(st.sampled_from(STRINGS + ("1", "2")), min_size=1, max_size=3),
    ),
    st.builds(
        lambda name, lo, hi: Node(f"{name} BETWEEN {lo} AND {hi}", "between", (name, lo, hi)),
        names,
        ints,
        ints,
    ),
    st.builds(lambda name: Node(f"{name} IS NULL", "isnull", (name,)), names),
)


def combine(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    return st.one_of(
        st.builds(lambda x: Node(f"NOT ({x.text})", "not", (x,)), children),
        st.builds(
            lambda x, y: Node(f"({x.text}) AND ({y.text})", "and", (x, y)), children, children
        ),
        st.builds(lambda x, y: Node(f"({x.text}) OR ({y.text})", "or", (x, y)), children, children),
    )


expressions = st.recursive(leaves, combine, max_leaves=8)
property_maps = st.dictionaries(names, VALUES, max_size=3)


@settings(max_examples=400, deadline=None)
@given(expressions, st.lists(property_maps, min_size=1, max_size=5))
def test_generated_expressions_match_the_reference(node: Node, maps: list[dict[str, str]]) -> None:
    f = compile_sql(node.text)
    for p in maps:
        assert f.matches(p) is (ref(node, p) is True), (node.text, p, ref(node, p))


@settings(max_examples=200, deadline=None)
@given(expressions)
def test_generated_expressions_compile_the_same_whatever_the_spacing_and_case(node: Node) -> None:
    text = node.text.replace(" AND ", "\n and\t").replace(" OR ", "  or ").replace("NOT ", "not ")
    p = {"a": "3", "b": "eu", "c": "-4"}
    assert compile_sql(text).matches(p) is compile_sql(node.text).matches(p)

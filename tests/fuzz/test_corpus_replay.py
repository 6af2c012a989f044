"""Replays the committed fuzz corpus and every finding through its target (plain Python calls,
no atheris), and property tests that feed each parser structured, mutated inputs.

A target raises only when a parser breaks its contract (see ``targets.py``), so each test here
fails with the input that did it.
"""

from __future__ import annotations

import json
import os

import msgpack
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.fuzz import seeds
from tests.fuzz.regressions import REGRESSIONS
from tests.fuzz.targets import TARGETS
from txmq.protocol.codes import SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import encode_frame

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
#: What the fuzzer was run with (``bench/fuzz.py --max-len``): corpus files are no longer.
MAX_LEN = 4096

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _corpus(target: str) -> list[tuple[str, bytes]]:
    folder = os.path.join(CORPUS, target)
    out = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as fh:
            out.append((name, fh.read()))
    return out


def test_every_target_has_a_corpus() -> None:
    assert sorted(os.listdir(CORPUS)) == sorted(TARGETS), "one corpus folder per target"
    for target in TARGETS:
        files = _corpus(target)
        assert files, f"the corpus of {target} is empty"
        assert len(files) <= 800, f"the corpus of {target} has {len(files)} files: merge it"
        too_long = [n for n, data in files if len(data) > MAX_LEN]
        assert not too_long, f"{target}: corpus files longer than {MAX_LEN} bytes: {too_long}"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_corpus_replays(target: str) -> None:
    fn = TARGETS[target]
    for name, data in _corpus(target):
        try:
            fn(data)
        except BaseException as exc:
            raise AssertionError(f"{target}: corpus file {name} ({data[:80]!r}): {exc!r}") from exc


def test_seeds_are_in_the_corpus() -> None:
    """The seeds made by the encoders stay in the corpus (a merge keeps what covers most, so
    this checks they still replay, whichever file holds their coverage)."""
    for target, inputs in seeds.seeds().items():
        for data in inputs:
            TARGETS[target](data)


@pytest.mark.parametrize("target,data", [pytest.param(t, d, id=name) for t, name, d in REGRESSIONS])
def test_regression(target: str, data: bytes) -> None:
    TARGETS[target](data)


# -- structured inputs -------------------------------------------------------------------------

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), text, st.binary(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    """``base`` with a few bytes overwritten, inserted or cut."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "insert", "cut"]))
        pos = draw(st.integers(0, len(data)))
        if op == "set" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[pos : pos + draw(st.integers(1, 4))]
    return bytes(data)


def _seed(target: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from(seeds.seeds()[target])


@SETTINGS
@given(st.data())
def test_frames_with_mutated_headers(data: st.DataObject) -> None:
    base = data.draw(_seed("frame"))
    TARGETS["frame"](data.draw(mutated(base)))


@SETTINGS
@given(
    st.sampled_from([0, 1, 2]),
    st.dictionaries(text, st.one_of(st.integers(), st.booleans(), text), max_size=10),
    st.one_of(st.none(), text),
)
def test_frames_with_any_ext_fields(
    st_type: int, ext: dict[str, object], remark: str | None
) -> None:
    cmd = RemotingCommand(
        code=10, ext_fields=ext, remark=remark, serialize_type=SerializeType(st_type)
    )
    try:
        frame = encode_frame(cmd)
    except Exception:
        return  # not every value has every encoding
    TARGETS["frame"](frame)
    TARGETS["remoting_header"](bytes([st_type]) + frame[8:])


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(["topic", "queueId", "sysFlag", "a", "b", "producerGroup"]), values
    )
)
def test_headers_with_any_values(ext: dict[str, object]) -> None:
    TARGETS["remoting_header"](b"\x02" + _packed({"code": 10, "extFields": ext}))


@SETTINGS
@given(st.data())
def test_mutated_stored_messages_batches_and_properties(data: st.DataObject) -> None:
    for target in ("stored_message", "batch", "properties", "sql_filter", "grpc_request"):
        TARGETS[target](data.draw(mutated(data.draw(_seed(target)))))


def _packed(doc: object) -> bytes:
    """``doc`` as msgpack; hypothesis drops the ones msgpack cannot carry (ints beyond 64
    bits)."""
    try:
        return bytes(msgpack.packb(doc, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        assume(False)
        raise


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(["v", "k", "g", "t", "h", "r", "ts", "bk", "c"]), values, max_size=9
    ),
    st.booleans(),
)
def test_op_records_with_any_fields(doc: dict[str, object], valid_head: bool) -> None:
    if valid_head:
        doc = {**doc, "v": 1, "k": "commit"}
    TARGETS["op_record"](_packed(doc))


@SETTINGS
@given(values, st.lists(values, max_size=3), st.lists(values, max_size=3))
def test_snapshots_and_check_state_with_any_rows(
    clog: object, records: list[object], batches: list[object]
) -> None:
    doc = {"v": 1, "clog": clog, "halfFrom": 0, "opFrom": 0, "records": records, "batches": batches}
    TARGETS["tx_snapshot"](_packed(doc))
    TARGETS["check_state"](
        json.dumps({"version": 1, "checks": {"t": records}}, default=repr).encode()
    )


@SETTINGS
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "globalWhiteRemoteAddresses": values,
            "accounts": st.lists(
                st.dictionaries(
                    st.sampled_from(
                        [
                            "accessKey",
                            "secretKey",
                            "whiteRemoteAddress",
                            "admin",
                            "defaultTopicPerm",
                            "defaultGroupPerm",
                            "topicPerms",
                            "groupPerms",
                        ]
                    ),
                    values,
                ),
                max_size=3,
            ),
            "dataVersion": values,
        },
    )
)
def test_acl_documents_with_any_values(doc: dict[str, object]) -> None:
    TARGETS["acl_file"](yaml.safe_dump(doc).encode())


_SQL_ATOMS = ["a", "b", "TAGS", "1", "-2.5", "'x'", "TRUE", "NULL", "(", ")", "AND", "OR", "NOT"]
_SQL_OPS = ["=", "<>", ">", "<=", "+", "*", "/", "IN", "BETWEEN", "LIKE", "IS", ","]


@SETTINGS
@given(st.lists(st.sampled_from(_SQL_ATOMS + _SQL_OPS), min_size=1, max_size=12), st.data())
def test_sql_made_of_tokens(tokens: list[str], data: st.DataObject) -> None:
    record = data.draw(mutated(seeds.seeds()["stored_message"][0]))
    TARGETS["sql_filter"](" ".join(tokens).encode() + b"\x00" + record)

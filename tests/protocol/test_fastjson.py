"""fastjson's object-keyed maps: written as RocketMQ's Java side writes them, read back, and
plain JSON read as json does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.protocol.fastjson import ObjectKeyMap, dumps, loads

MQ = {"topic": "t", "brokerName": "b", "queueId": 0}


def test_an_object_keyed_map_is_written_as_fastjson_writes_it() -> None:
    doc = {"offsetTable": ObjectKeyMap([(MQ, {"brokerOffset": 5, "consumerOffset": 3})])}
    text = dumps(doc)
    assert text == (
        '{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:'
        '{"brokerOffset":5,"consumerOffset":3}}}'
    )
    back = loads(text)
    assert isinstance(back["offsetTable"], ObjectKeyMap)
    assert list(back["offsetTable"]) == [
        ({"brokerName": "b", "queueId": 0, "topic": "t"}, {"brokerOffset": 5, "consumerOffset": 3})
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_plain_json_reads_as_json_does(doc: object) -> None:
    text = json.dumps(doc)
    assert loads(text) == json.loads(text)
    assert loads(dumps(doc)) == json.loads(text)


@pytest.mark.parametrize("bad", ["", "{", '{"a":1', "[1,2", '{"a" 1}', "{[1]:2}", "1 2", "nul"])
def test_bad_documents_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        loads(bad)

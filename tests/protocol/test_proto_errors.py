"""The error table is total and works both ways (code -> exception -> code)."""

from __future__ import annotations

import pytest

from txmq.protocol.codes import ResponseCode
from txmq.protocol.errors import (
    BrokerResponseError,
    ConnectionClosedError,
    ProtocolError,
    RequestTimeoutError,
    TxmqError,
    error_classes,
    error_for_code,
)

NON_SUCCESS = [c for c in ResponseCode if c != ResponseCode.SUCCESS]


def test_table_is_total() -> None:
    table = error_classes()
    missing = [c.name for c in NON_SUCCESS if c not in table]
    assert not missing, f"response codes without an exception class: {missing}"
    assert ResponseCode.SUCCESS not in table


@pytest.mark.parametrize("code", NON_SUCCESS, ids=lambda c: c.name)
def test_error_for_code_round_trips(code: ResponseCode) -> None:
    err = error_for_code(code, "the remark")
    assert isinstance(err, BrokerResponseError)
    assert isinstance(err, TxmqError)
    assert err.code == code
    assert str(err) == "the remark"
    # The broker raises the class; the code it answers with is the class's code.
    cls = type(err)
    assert cls.code == code
    assert cls.__name__.endswith("Error")
    assert isinstance(cls.retriable, bool)


def test_classes_are_distinct() -> None:
    table = error_classes()
    assert len(set(table.values())) == len(table)


def test_error_for_code_without_remark_still_says_something() -> None:
    err = error_for_code(ResponseCode.TOPIC_NOT_EXIST)
    assert str(err)


@pytest.mark.parametrize("code", [5, 9999, 10001, -1])
def test_unknown_code_keeps_the_number(code: int) -> None:
    err = error_for_code(code, "strange")
    assert isinstance(err, BrokerResponseError)
    assert err.code == code
    assert str(code) in str(err)
    assert "strange" in str(err)
    # The class-level code is untouched: the next error of that class is still SYSTEM_ERROR.
    assert type(err).code == ResponseCode.SYSTEM_ERROR
    assert error_for_code(ResponseCode.SYSTEM_ERROR).code == ResponseCode.SYSTEM_ERROR


def test_retriable_flags() -> None:
    retriable = {c for c, cls in error_classes().items() if cls.retriable}
    assert ResponseCode.SYSTEM_BUSY in retriable
    assert ResponseCode.FLUSH_DISK_TIMEOUT in retriable
    assert ResponseCode.SERVICE_NOT_AVAILABLE in retriable
    assert ResponseCode.MESSAGE_ILLEGAL not in retriable
    assert ResponseCode.NO_PERMISSION not in retriable
    assert ResponseCode.INVALID_PARAMETER not in retriable


def test_builtin_bases() -> None:
    assert issubclass(ConnectionClosedError, ConnectionError)
    assert issubclass(RequestTimeoutError, TimeoutError)
    assert ConnectionClosedError.retriable and RequestTimeoutError.retriable
    assert issubclass(ProtocolError, TxmqError)
    assert not issubclass(ProtocolError, BrokerResponseError)

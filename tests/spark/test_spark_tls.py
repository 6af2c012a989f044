"""The ``txmq`` sink and source over TLS in real Spark (``local[2]``): against a broker that
enforces mutual TLS, a streaming query writes every row exactly once and a streaming read gets
them back, both with the ``tls*`` options (each task and driver callback builds its TLS context
from the files); a wrong CA, a missing file or plain TCP fail the query with a clear error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import BROKER_SETTINGS, order_ids, order_rows, pull_all, spark_fixture
from tests.support.certs import Certs, make_certs
from txmq.broker.config import BrokerConfig
from txmq.client import ClientConfig
from txmq.client.config import tls_context

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[BrokerThread]:
    """A broker that accepts only TLS connections with a client certificate its CA signed."""
    settings = {
        **BROKER_SETTINGS,
        **certs.broker_settings("enforcing", client_auth="require"),
        "store_path_root_dir": str(tmp_path_factory.mktemp("tls-broker")),
    }
    bt = BrokerThread(BrokerConfig(**settings))
    bt.start()
    try:
        yield bt
    finally:
        bt.stop()


spark = spark_fixture("local[2]", "txmq-tls-tests")


def tls_options(certs: Certs, ca: Path | None = None) -> dict[str, str]:
    return {
        "tls": "true",
        "tlsCaPath": str(ca or certs.ca),
        "tlsCertPath": str(certs.client_cert),
        "tlsKeyPath": str(certs.client_key),
    }


def _orders(spark: Any, folder: str) -> Any:
    from pyspark.sql import functions as F

    return order_rows(spark, folder).select(
        F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit("|")).alias("body"),
        F.col("customer").alias("keys"),
    )


def test_sink_and_source_over_mutual_tls_deliver_every_row_exactly_once(
    spark: Any, tls_broker: BrokerThread, certs: Certs, json_input: Any, tmp_path: Path
) -> None:
    address, topic = tls_broker.address, "tls-orders"
    folder = json_input([range(0, 300), range(300, 600)])
    sink = (
        _orders(spark, folder)
        .writeStream.format("txmq")
        .option("broker", address)
        .option("topic", topic)
        .options(**tls_options(certs))
        .option("checkpointLocation", str(tmp_path / "sink-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert sink.awaitTermination(180), "the TLS sink query did not finish within 180 s"
    assert sink.exception() is None
    # Read back through the SDK over TLS: every row once.
    sdk = ClientConfig(
        tls=tls_context(str(certs.ca), str(certs.client_cert), str(certs.client_key))
    )
    assert order_ids(pull_all(address, topic, sdk)) == list(range(600))

    # The streaming source over TLS: offsets planned on the driver, queues read by the tasks.
    read = (
        spark.readStream.format("txmq")
        .option("broker", address)
        .option("topic", topic)
        .options(**tls_options(certs))
        .load()
        .writeStream.format("memory")
        .queryName("tls_read")
        .option("checkpointLocation", str(tmp_path / "source-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert read.awaitTermination(180), "the TLS source query did not finish within 180 s"
    assert read.exception() is None
    got = sorted(
        int(r.body.split(b"|")[0][6:]) for r in spark.sql("SELECT body FROM tls_read").collect()
    )
    assert got == list(range(600))


def _failure(query: Any) -> str:
    """The text of the error that ended ``query`` (it must end within 120 s)."""
    from pyspark.errors import StreamingQueryException

    try:
        finished = query.awaitTermination(120)
    except StreamingQueryException as exc:
        return str(exc)
    query.stop()
    raise AssertionError(f"the query did not fail (finished: {finished})")


def test_a_wrong_ca_fails_sink_and_source_naming_the_ca(
    spark: Any, tls_broker: BrokerThread, certs: Certs, json_input: Any, tmp_path: Path
) -> None:
    address = tls_broker.address
    folder = json_input([range(0, 10)])
    wrong = tls_options(certs, ca=certs.wrong_ca)
    sink = (
        _orders(spark, folder)
        .writeStream.format("txmq")
        .option("broker", address)
        .option("topic", "tls-wrong-ca")
        .options(**wrong)
        .option("checkpointLocation", str(tmp_path / "sink-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    text = _failure(sink)
    assert "TLS handshake with" in text and "certificate verify failed" in text, text
    assert f"the CA file {str(certs.wrong_ca)!r} (option tlsCaPath)" in text, text

    source = (
        spark.readStream.format("txmq")
        .option("broker", address)
        .option("topic", "tls-orders")
        .options(**wrong)
        .load()
        .writeStream.format("memory")
        .queryName("tls_wrong_ca")
        .option("checkpointLocation", str(tmp_path / "source-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    text = _failure(source)
    assert "certificate verify failed" in text and "option tlsCaPath" in text, text


def test_a_missing_tls_file_is_refused_when_the_query_starts(
    spark: Any, tls_broker: BrokerThread, certs: Certs, json_input: Any, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-ca.pem")
    with pytest.raises(Exception, match=r"option tlsCaPath: cannot load the TLS CA file"):
        (
            _orders(spark, json_input([range(0, 10)]))
            .writeStream.format("txmq")
            .option("broker", tls_broker.address)
            .option("topic", "tls-missing")
            .options(**tls_options(certs, ca=Path(missing)))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination(120)
        )

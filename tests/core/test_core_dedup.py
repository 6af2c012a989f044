"""The duplicate window of the send use case: a message resent with the same UNIQ_KEY within
``duplicateWindowSeconds`` is answered with the first send's receipt and not stored again;
after the window it is a new message; the window is rebuilt from the commit log on a restart."""

from __future__ import annotations

from tests.support.core import CoreHarness, half, message

TOPIC = "Payments"


async def test_a_resend_gets_the_first_receipt_and_is_stored_once(harness: CoreHarness) -> None:
    first = await harness.send(message(TOPIC, b"pay 1", uniq="U-1"))
    again = await harness.send(message(TOPIC, b"pay 1", uniq="U-1"))

    assert again.receipts == first.receipts
    assert harness.bodies(TOPIC) == [b"pay 1"]


async def test_a_resend_with_another_body_still_answers_the_first(harness: CoreHarness) -> None:
    first = await harness.send(message(TOPIC, b"original", uniq="U-2"))
    again = await harness.send(message(TOPIC, b"changed on the way", uniq="U-2"))

    assert again.receipts[0].offset_msg_id == first.receipts[0].offset_msg_id
    assert again.receipts[0].queue_offset == first.receipts[0].queue_offset
    assert harness.bodies(TOPIC) == [b"original"]


async def test_ids_repeated_in_one_batch_and_across_batches_are_stored_once(
    harness: CoreHarness,
) -> None:
    one = await harness.send(
        message(TOPIC, b"a", uniq="B-a"),
        message(TOPIC, b"b", uniq="B-b"),
        message(TOPIC, b"a again", uniq="B-a"),
    )
    assert one.receipts[2] == one.receipts[0]

    two = await harness.send(message(TOPIC, b"b", uniq="B-b"), message(TOPIC, b"c", uniq="B-c"))

    assert two.receipts[0] == one.receipts[1]
    assert harness.bodies(TOPIC) == [b"a", b"b", b"c"]


async def test_after_the_window_the_same_id_is_a_new_message(harness: CoreHarness) -> None:
    window = harness.config.duplicate_window_seconds
    first = await harness.send(message(TOPIC, b"early", uniq="U-3"))

    harness.clock.advance(window - 1)
    inside = await harness.send(message(TOPIC, b"early", uniq="U-3"))
    assert inside.receipts == first.receipts

    harness.clock.advance(2)
    later = await harness.send(message(TOPIC, b"late", uniq="U-3"))
    assert later.receipts[0].queue_offset != first.receipts[0].queue_offset
    assert harness.bodies(TOPIC) == [b"early", b"late"]


async def test_other_ids_and_other_topics_are_not_duplicates(harness: CoreHarness) -> None:
    await harness.send(message(TOPIC, b"1", uniq="U-4"))
    await harness.send(message(TOPIC, b"2", uniq="U-5"))
    await harness.send(message("Refunds", b"3", uniq="U-4"))

    assert harness.bodies(TOPIC) == [b"1", b"2"]
    assert harness.bodies("Refunds") == [b"3"]


async def test_the_window_is_rebuilt_after_a_restart(harness: CoreHarness) -> None:
    first = await harness.send(message(TOPIC, b"before", uniq="U-6"))

    await harness.reopen()
    again = await harness.send(message(TOPIC, b"before", uniq="U-6"))

    assert again.receipts == first.receipts
    assert harness.bodies(TOPIC) == [b"before"]


async def test_a_resent_half_is_not_a_second_half(harness: CoreHarness) -> None:
    first = await harness.send(half(TOPIC, "tx-resent"))
    again = await harness.send(half(TOPIC, "tx-resent"))

    assert again.receipts == first.receipts
    assert len(harness.tx.find("tx-resent", None).halves) == 1

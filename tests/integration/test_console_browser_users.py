"""The web console with its own users over HTTPS, in a real headless chromium against a real
broker: sign-in, a viewer who reads every page but is refused every action, an operator who
resends a dead letter (the consumer receives it again) and resets a group's offsets (its lag
grows back), the charts after some traffic, key search and a transaction's trace.

Screenshots go where tests/integration/test_console.py puts its own (docs/console/ with
TXMQ_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import BrokerThread
from tests.integration.test_console import (
    TOPIC,
    Scene,
    browser_available,
    click_and_wait,
    open_page,
    rows,
    shot,
)
from tests.support.browser import PAGE_TIMEOUT, ConsoleProcess, chromium
from tests.support.certs import make_certs
from tests.support.waiting import wait_until_sync
from txmq.client import AsyncPullConsumer, AsyncPushConsumer, ConsumeFrom, MessageExt
from txmq.client.console.users import add_user
from txmq.protocol.codes import RequestCode
from txmq.protocol.headers import ConsumerSendMsgBackRequestHeader

pytestmark = [pytest.mark.slow, pytest.mark.external]
__all__ = ["browser_available"]  # the module's autouse fixture: skip without chromium

OPERATOR = ("olga", "operator-pw-1")
VIEWER = ("victor", "viewer-pw-1")
REFUND = "refund 7"


class DeadLetters:
    """Topic payments with one message (key refund-7) that group settlers gave up on (it is in
    %DLQ%settlers), and group refunds online on payments, keeping what it receives."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.received: list[str] = []
        self._lock = threading.Lock()
        self.consumer: AsyncPushConsumer | None = None
        self.msg_id = ""

    def bodies(self) -> list[str]:
        with self._lock:
            return list(self.received)

    def _on(self, msg: MessageExt) -> None:
        with self._lock:
            self.received.append(msg.body.decode())

    def build(self) -> None:
        self.scene.run(self._topic())
        self.scene.send_to("payments", REFUND, keys="refund-7")
        self.scene.run(self._build())
        wait_until_sync(lambda: self.bodies() == [REFUND], PAGE_TIMEOUT, "refunds to receive it")

    async def _topic(self) -> None:
        async with self.scene.admin() as admin:
            await admin.create_topic("payments", queues=1)

    async def _build(self) -> None:
        address = self.scene.address
        async with AsyncPullConsumer("settlers", address) as pc:
            [m] = (await pc.pull("payments", 0, 0, 1)).messages
            self.msg_id = m.msg_id
            header = ConsumerSendMsgBackRequestHeader(
                offset=m.commit_log_offset,
                group="settlers",
                delay_level=-1,  # straight to the dead-letter queue
                origin_msg_id=m.msg_id,
                origin_topic="payments",
            )
            await pc.connection.invoke(RequestCode.CONSUMER_SEND_MSG_BACK, header)
        self.consumer = AsyncPushConsumer("refunds", address, consume_from=ConsumeFrom.FIRST)
        self.consumer.subscribe("payments", "*", self._on)
        await self.consumer.start()

    def close(self) -> None:
        if self.consumer is not None:
            self.scene.run(self.consumer.shutdown(), timeout=30)


def audit_committed(scene: Scene) -> list[int]:
    async def get() -> list[int]:
        async with scene.admin() as admin:
            return [s["consumerOffset"] for s in await admin.consume_stats("audit", TOPIC)]

    result: list[int] = scene.run(get())
    return result


def sign_in(driver: Any, credentials: tuple[str, str], marker: str) -> str:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "username").send_keys(credentials[0])
    driver.find_element(By.ID, "password").send_keys(credentials[1])
    return click_and_wait(driver, "sign-in", marker)


def points(driver: Any, chart_id: str) -> int:
    from selenium.webdriver.common.by import By

    return len(driver.find_elements(By.CSS_SELECTOR, f"svg#{chart_id} circle.point"))


@pytest.fixture
def traced_broker(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(transaction_check_max=100_000, trace_topic_enable=True)


def test_users_roles_https_charts_dead_letters_reset_search_and_trace(
    traced_broker: BrokerThread, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    users = tmp_path / "users.yml"
    add_user(users, *OPERATOR, "operator")
    add_user(users, *VIEWER, "viewer")
    certs = make_certs(tmp_path / "certs")
    scene = Scene(traced_broker.address)
    dead = DeadLetters(scene)
    console = ConsoleProcess(
        traced_broker.address,
        extra=[
            "--users",
            str(users),
            "--tls-cert",
            str(certs.server_cert),
            "--tls-key",
            str(certs.server_key),
            "--sample-seconds",
            "1",
        ],
    )
    try:
        scene.build()
        dead.build()
        base = console.start()
        assert base.startswith("https://127.0.0.1:"), base
        with chromium(extra_args=["--ignore-certificate-errors"]) as d:
            # HTTPS; every page asks for a sign-in with the console's own users
            open_page(d, base + "groups", "login")
            assert d.current_url.startswith("https://") and "/login" in d.current_url
            cookie = d.get_cookie("txmq_console")
            assert cookie is not None and cookie["secure"] and cookie["httpOnly"], cookie
            shot(d, "users-login")
            text = sign_in(d, (VIEWER[0], "not-the-password"), "login")
            assert "Wrong user name or password" in text

            # a viewer reads every page
            sign_in(d, VIEWER, "groups")
            assert d.find_element(By.ID, "role").text == "viewer"
            for url, marker in (
                ("", "broker"),
                ("topics", "topics"),
                ("groups/audit", "lag"),
                ("transactions", "transactions"),
                ("dlq?group=settlers", "dead"),
                ("search", "search-form"),
                ("trace", "trace-form"),
            ):
                open_page(d, base + url, marker)
            # ... but sees no action and is refused each one, even asked for directly
            assert d.find_elements(By.ID, "resend-all") == []
            open_page(d, base + "transactions/" + quote(scene.transaction_id), "txn")
            assert d.find_elements(By.ID, "commit") == []
            open_page(d, base + "groups/audit", "lag")
            assert d.find_elements(By.LINK_TEXT, "Reset offsets…") == []
            for url in (
                "transactions/" + quote(scene.transaction_id) + "/confirm?action=commit",
                "dlq/confirm?group=settlers",
                "groups/audit/reset",
            ):
                text = open_page(d, base + url, "error")
                assert "victor is a viewer: only an operator may" in text, (url, text)
            shot(d, "viewer-refused")
            assert scene.transaction()["state"] == "PENDING"

            # the charts: a point a second; traffic shows in the send rate
            for i in range(20):
                scene.send(f"more {i}")
            wait_until_sync(
                lambda: (
                    open_page(d, base, "charts") is not None
                    and points(d, "chart-send") >= 5
                    and points(d, "chart-pending") >= 5
                ),
                PAGE_TIMEOUT,
                "the overview's charts to have points",
            )
            sends = [
                float(t.get_attribute("textContent").split(": ")[1].split()[0])
                for t in d.find_elements(By.CSS_SELECTOR, "svg#chart-send circle.point title")
            ]
            assert max(sends) > 0, sends
            shot(d, "charts")

            # key search: the message of payments with key refund-7
            open_page(d, base + "search", "search-form")
            d.find_element(By.ID, "topic").send_keys("payments")
            d.find_element(By.ID, "key").send_keys("refund-7")
            click_and_wait(d, "find", "found")
            [row] = rows(d, "found")
            assert row[1] == "payments" and row[5] == "refund-7" and row[7] == REFUND, row
            shot(d, "search")

            # the dead letter's trace: stored, delivered to settlers, sent to the DLQ
            def traced() -> bool:
                open_page(d, base + "trace?key=" + dead.msg_id, "timeline")
                steps = [r[1] for r in rows(d, "timeline")]
                return steps[:1] == ["stored"] and "sent-back" in steps

            wait_until_sync(traced, PAGE_TIMEOUT, "the transaction's trace")
            shot(d, "trace")

            # the operator: resend the dead letter, confirmed; refunds receives it again
            click_and_wait(d, "logout", "login")
            sign_in(d, OPERATOR, "broker")
            assert d.find_element(By.ID, "role").text == "operator"
            open_page(d, base + "dlq?group=settlers", "dead")
            [row] = rows(d, "dead")
            assert row[1] == "payments" and row[4] == REFUND, row
            shot(d, "dlq")
            click_and_wait(d, "resend-" + dead.msg_id, "confirm")
            assert [r[0] for r in rows(d, "to-resend")] == [dead.msg_id]
            text = click_and_wait(d, "confirm", "resent")
            assert "1 message(s) of settlers sent back" in text
            [done] = rows(d, "resent")
            assert done[0] == dead.msg_id and done[1] == "payments" and done[3] == "SEND_OK"
            shot(d, "dlq-resent")
            wait_until_sync(
                lambda: dead.bodies() == [REFUND, REFUND],
                PAGE_TIMEOUT,
                "refunds to receive the resent message",
            )
            # resend all at once, again: the broker's duplicate window answers with the first
            # resend's message id, and stores no second copy
            open_page(d, base + "dlq?group=settlers", "dead")
            click_and_wait(d, "resend-all", "confirm")
            click_and_wait(d, "confirm", "resent")
            [again] = rows(d, "resent")
            assert again[2] == done[2], (again, done)

            # reset audit's offsets on orders to the earliest message, confirmed
            assert any(audit_committed(scene))
            open_page(d, base + "groups/audit", "lag")
            d.find_element(By.LINK_TEXT, "Reset offsets…").click()
            wait_until_sync(lambda: "reset-form" in d.page_source, PAGE_TIMEOUT, "the reset form")
            d.find_element(By.ID, "to-earliest").click()
            click_and_wait(d, "next", "current")
            shot(d, "reset")
            click_and_wait(d, "confirm", "moved")
            assert {r[1] for r in rows(d, "moved")} == {"0"}, rows(d, "moved")
            shot(d, "reset-done")
            assert audit_committed(scene) == [0, 0, 0, 0]

            # the group's lag chart shows the lag grow back
            wait_until_sync(
                lambda: (
                    open_page(d, base + "groups/audit", "chart-group-lag") is not None
                    and points(d, "chart-group-lag") >= 5
                ),
                PAGE_TIMEOUT,
                "the group's lag chart",
            )
            shot(d, "group-lag")

            # a form without this session's CSRF token changes nothing
            d.execute_script(
                "var f = document.createElement('form'); f.method = 'post';"
                "f.action = arguments[0]; document.body.appendChild(f); f.submit();",
                base + "groups/audit/reset",
            )
            wait_until_sync(lambda: "CSRF" in d.page_source, PAGE_TIMEOUT, "the CSRF refusal")
        assert console.stop() == 0, console.output
    finally:
        console.stop()
        dead.close()
        scene.close()

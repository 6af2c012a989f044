"""The web console (``txmq console``) in a real headless chromium, against a real broker with
real data: topics, a consumer group online, one with lag, a transaction whose producer answers
UNKNOWN to every check.  Every page loads and shows that data; an operator commits the hanging
transaction from its page and the consumer then receives the message; with the broker's ACL
on, a read-only account sees the pages but its commit is refused and nothing is committed.

Each page is saved as a screenshot (in docs/console/, which docs/console.md shows, when
TXMQ_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import BrokerThread
from tests.support import scratch
from tests.support.acl_files import account, acl_file, write_acl
from tests.support.browser import PAGE_TIMEOUT, ConsoleProcess, chromium, need_chromium
from tests.support.cluster import BrokerCluster
from tests.support.etcd import EtcdCluster, etcd_binary
from tests.support.waiting import wait_until_sync
from txmq.client import (
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    ClientConfig,
    ConsumeFrom,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionListener,
)
from txmq.client.admin import AsyncAdminClient
from txmq.client.bridge import LoopThread

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "console"
#: Where this run's screenshots go: docs/console/ with TXMQ_UPDATE_SCREENSHOTS=1 (to refresh the
#: guide's pictures; ports, ids and times differ every run), else a scratch folder, so a test
#: run leaves the checkout as it was.
SHOTS_OUT = (
    SHOTS
    if os.environ.get("TXMQ_UPDATE_SCREENSHOTS") == "1"
    else Path(scratch.mkdtemp("console-shots-"))
)

TOPIC = "orders"
TX_GROUP = "shop-tx"
#: A body and a property that would run script or make markup if the console did not escape.
NASTY_BODY = "order 42 <script>window.pwned = 1</script> & <b>bold</b>"
NASTY_NOTE = '<img src=x onerror="window.pwned=2">'

ACL_FILE = acl_file(
    account("operator", "secret-op-123", admin=True),
    account("viewer", "secret-view-123", defaultTopicPerm="SUB", defaultGroupPerm="SUB"),
    white_listed=True,
)
OPERATOR = ("operator", "secret-op-123")
VIEWER = ("viewer", "secret-view-123")


class Undecided(TransactionListener):
    """A producer whose local transaction never settles: UNKNOWN, then UNKNOWN to every
    check."""

    def __init__(self) -> None:
        self.checks = 0

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checks += 1
        return LocalTransactionState.UNKNOWN


class Scene:
    """The broker's data: topic orders (4 queues, 8 messages), topic audit-log, consumer group
    billing online on orders (it receives what is committed), group audit with committed
    offsets behind the queues' ends (lag), and a hanging transaction of group shop-tx."""

    def __init__(self, address: str, credentials: tuple[str, str] | None = None) -> None:
        self.address = address
        self.credentials = credentials
        self.config = ClientConfig(
            access_key=credentials[0] if credentials else None,
            secret_key=credentials[1] if credentials else None,
        )
        self.loop = LoopThread("test-console-clients")
        self.received: list[MessageExt] = []
        self._lock = threading.Lock()
        self.audit_lag = 0
        self.transaction_id = ""
        self.offset_msg_id = ""
        self.listener = Undecided()
        self.billing: AsyncPushConsumer | None = None
        self.tx: AsyncTransactionProducer | None = None

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return self.loop.run(coro, timeout=timeout)

    def admin(self) -> AsyncAdminClient:
        ak, sk = self.credentials or (None, None)
        return AsyncAdminClient(self.address, access_key=ak, secret_key=sk)

    def bodies(self) -> list[str]:
        with self._lock:
            return [m.body.decode() for m in self.received]

    def _on_message(self, msg: MessageExt) -> None:
        with self._lock:
            self.received.append(msg)

    def build(self) -> None:
        self.run(self._build())
        wait_until_sync(
            lambda: len(self.bodies()) >= 8, PAGE_TIMEOUT, "billing to receive the 8 messages"
        )
        wait_until_sync(
            lambda: self.billing_lag() == 0,
            PAGE_TIMEOUT,
            "billing's committed offsets to reach the ends of the queues",
        )
        wait_until_sync(
            lambda: self.transaction()["checkTimes"] >= 2,
            PAGE_TIMEOUT,
            "the broker to ask the producer about the hanging transaction twice",
        )

    async def _build(self) -> None:
        async with self.admin() as admin:
            await admin.create_topic(TOPIC, queues=4)
            await admin.create_topic("audit-log", queues=2)
        producer = AsyncProducer("shop", self.address, config=self.config)
        await producer.start()
        try:
            for i in range(8):
                await producer.send_message(Message(TOPIC, f"order {i}".encode(), tags="created"))
            await producer.send_message(Message("audit-log", b"audit entry"))
        finally:
            await producer.shutdown()
        # audit read half of each queue of orders, one message at a time, and committed that
        audit = AsyncPullConsumer("audit", self.address, config=self.config)
        await audit.start()
        try:
            for q in range(4):
                end = await audit.max_offset(TOPIC, q)
                done = end // 2
                await audit.commit_offset(TOPIC, q, done)
                self.audit_lag += end - done
        finally:
            await audit.shutdown()
        self.billing = AsyncPushConsumer(
            "billing", self.address, consume_from=ConsumeFrom.FIRST, config=self.config
        )
        self.billing.subscribe(TOPIC, "*", self._on_message)
        await self.billing.start()
        self.tx = AsyncTransactionProducer(
            TX_GROUP, self.listener, self.address, config=self.config
        )
        await self.tx.start()
        msg = Message(
            TOPIC,
            NASTY_BODY.encode(),
            tags="paid",
            keys="order-42",
            properties={"note": NASTY_NOTE},
        )
        result = await self.tx.send_message_in_transaction(msg)
        self.transaction_id = result.transaction_id or result.msg_id
        self.offset_msg_id = result.offset_msg_id or ""

    def billing_lag(self) -> int | None:
        async def get() -> int | None:
            async with self.admin() as admin:
                stats = await admin.consume_stats("billing", TOPIC)
            return sum(s["lag"] for s in stats) if len(stats) == 4 else None

        result: int | None = self.run(get())
        return result

    def send(self, body: str) -> None:
        self.send_to(TOPIC, body)

    def send_to(self, topic: str, body: str, keys: str | None = None) -> None:
        async def go() -> None:
            producer = AsyncProducer("shop", self.address, config=self.config)
            await producer.start()
            try:
                await producer.send_message(Message(topic, body.encode(), keys=keys))
            finally:
                await producer.shutdown()

        self.run(go())

    def transaction(self) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            async with self.admin() as admin:
                return await admin.get_transaction(self.transaction_id)

        result: dict[str, Any] = self.run(get())
        return result

    def close(self) -> None:
        async def down() -> None:
            if self.tx is not None:
                await self.tx.shutdown()
            if self.billing is not None:
                await self.billing.shutdown()

        try:
            self.run(down(), timeout=30)
        finally:
            self.loop.stop()


@pytest.fixture(scope="module", autouse=True)
def browser_available() -> None:
    need_chromium()


@pytest.fixture
def tx_broker(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    # checks every 200 ms, and never parked: the transaction stays PENDING for the test
    return broker_thread_factory(transaction_check_max=100_000)


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def shot(driver: Any, name: str) -> None:
    SHOTS_OUT.mkdir(parents=True, exist_ok=True)
    # the whole page: a window as tall as its content (plus what the window itself takes)
    height, frame = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    driver.set_window_size(1280, max(600, min(int(height) + int(frame) + 16, 2400)))
    assert driver.save_screenshot(str(SHOTS_OUT / f"{name}.png")), f"no screenshot of {name}"
    driver.set_window_size(1280, 900)


def open_page(driver: Any, url: str, marker: str) -> str:
    """Load ``url`` and wait for the element of id ``marker``; the page's text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, PAGE_TIMEOUT).until(
        ec.presence_of_element_located((By.ID, marker)),
        f"{url}: no element #{marker}; the page says: {driver.find_element(By.TAG_NAME, 'body').text[:500]!r}",
    )
    return str(driver.find_element(By.TAG_NAME, "body").text)


def gone(element: Any) -> Callable[[Any], bool]:
    """A wait condition: ``element``'s document was replaced (a new page loaded). Chromium
    reports an element of a document being torn down either as stale or, while the new one
    loads, as a node that "does not belong to the document": both mean it is gone."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def check(_driver: Any) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    return check


def click_and_wait(driver: Any, element_id: str, marker: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.ID, element_id).click()
    WebDriverWait(driver, PAGE_TIMEOUT).until(gone(old), f"#{element_id} did nothing")
    WebDriverWait(driver, PAGE_TIMEOUT).until(
        ec.presence_of_element_located((By.ID, marker)),
        f"after #{element_id}: no element #{marker}; the page says: "
        f"{driver.find_element(By.TAG_NAME, 'body').text[:500]!r}",
    )
    return str(driver.find_element(By.TAG_NAME, "body").text)


def rows(driver: Any, table_id: str) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    out = []
    for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr"):
        out.append([td.text for td in tr.find_elements(By.TAG_NAME, "td")])
    return out


def kv_value(driver: Any, table_id: str, key: str) -> str:
    from selenium.webdriver.common.by import By

    for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tr"):
        if tr.find_element(By.TAG_NAME, "th").text == key:
            return str(tr.find_element(By.TAG_NAME, "td").text)
    raise AssertionError(f"no row {key!r} in #{table_id}")


def sign_in(driver: Any, credentials: tuple[str, str], marker: str) -> str:
    """Fill in the sign-in form on the current page and send it."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "access_key").send_keys(credentials[0])
    driver.find_element(By.ID, "secret_key").send_keys(credentials[1])
    return click_and_wait(driver, "sign-in", marker)


def test_every_page_shows_the_broker_and_an_operator_commits_a_hanging_transaction(
    tx_broker: BrokerThread, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    scene = Scene(tx_broker.address)
    console = ConsoleProcess(tx_broker.address)
    try:
        scene.build()
        base = console.start()
        d = browser

        # overview: who the broker is and its transactions
        text = open_page(d, base, "broker")
        assert kv_value(d, "broker", "broker name") == tx_broker.config.broker_name
        assert kv_value(d, "broker", "role") == "single node"
        assert kv_value(d, "broker", "address") == tx_broker.address
        disk = kv_value(d, "broker", "disk used")
        usage = shutil.disk_usage(tx_broker.config.store_path_root_dir)
        assert disk.endswith(" %"), disk
        assert abs(float(disk[:-2]) - usage.used / usage.total * 100) < 5, (disk, usage)
        assert kv_value(d, "txn-summary", "pending") == "1"
        assert "sign out" not in text  # no ACL, no sign-in
        shot(d, "overview")

        # topics: queues and messages; system topics only on demand
        open_page(d, base + "topics", "topics")
        by_topic = {r[0]: r for r in rows(d, "topics")}
        assert set(by_topic) == {TOPIC, "audit-log"}, by_topic
        assert by_topic[TOPIC][1:3] == ["4", "4"]
        assert by_topic[TOPIC][5] == "8"
        assert "audit" in by_topic[TOPIC][6] and "billing" in by_topic[TOPIC][6]
        shot(d, "topics")
        open_page(d, base + "topics?all=1", "topics")
        assert "RMQ_SYS_TRANS_HALF_TOPIC" in {r[0] for r in rows(d, "topics")}

        # one topic: min/max offsets per queue and each group's committed offsets
        d.find_element(By.LINK_TEXT, "hide system, retry and dead-letter topics").click()
        open_page(d, base + "topics", "topics")
        d.find_element(By.LINK_TEXT, TOPIC).click()
        wait_until_sync(lambda: 'id="queues"' in d.page_source, PAGE_TIMEOUT, "the topic page")
        queues = rows(d, "queues")
        assert [q[0] for q in queues] == ["0", "1", "2", "3"]
        assert sum(int(q[2]) for q in queues) == 8  # max offsets
        headers = [th.text for th in d.find_elements(By.CSS_SELECTOR, "#queues thead th")]
        assert "audit committed" in headers and "billing committed" in headers
        shot(d, "topic")

        # consumer groups: billing online, audit with its lag
        open_page(d, base + "groups", "groups")
        groups = {r[0]: r for r in rows(d, "groups")}
        assert groups["audit"][1] == "0" and groups["audit"][3] == str(scene.audit_lag)
        assert groups["billing"][1] == "1" and groups["billing"][3] == "0"
        assert scene.audit_lag > 0
        shot(d, "groups")
        open_page(d, base + "groups/audit", "lag")
        assert sum(int(r[4]) for r in rows(d, "lag")) == scene.audit_lag
        assert kv_value(d, "group-summary", "total lag") == str(scene.audit_lag)
        open_page(d, base + "groups/billing", "members")
        members = rows(d, "members")
        assert len(members) == 1 and members[0][2] == "PYTHON", members
        assert [TOPIC, "*"] in rows(d, "subscriptions")
        shot(d, "group")

        # transactions: the hanging one, by group and topic, with its age and checks
        open_page(d, base + "transactions", "transactions")
        listed = {r[0]: r for r in rows(d, "transactions")}
        assert scene.transaction_id in listed, listed
        row = listed[scene.transaction_id]
        assert row[1] == "PENDING" and row[2] == TX_GROUP and row[3] == TOPIC
        assert int(row[6]) >= 2, "checks sent"
        assert rows(d, "by-group")[0][:4] == [TX_GROUP, TOPIC, "1", "0"]
        shot(d, "transactions")

        # the message page, reached from the transaction: escaped body and properties
        d.find_element(By.LINK_TEXT, scene.transaction_id).click()
        wait_until_sync(lambda: "Actions" in d.page_source, PAGE_TIMEOUT, "the transaction page")
        assert kv_value(d, "txn", "state") == "PENDING"
        shot(d, "transaction")
        d.find_element(By.LINK_TEXT, scene.offset_msg_id).click()
        wait_until_sync(lambda: 'id="body"' in d.page_source, PAGE_TIMEOUT, "the message page")
        assert d.find_element(By.ID, "body").text == NASTY_BODY
        props = dict((r[0], r[1]) for r in rows(d, "properties"))
        assert props["note"] == NASTY_NOTE and props["TAGS"] == "paid"
        assert props["REAL_TOPIC"] == TOPIC
        assert d.find_elements(By.CSS_SELECTOR, "script, main img, #body b") == []
        assert d.execute_script("return window.pwned === undefined")
        shot(d, "message")

        # an unknown id is said so, not a crash
        text = open_page(d, base + "messages?id=" + quote("<nope>"), "error")
        assert "is not a message id or an offset message id" in text and "<nope>" in text

        # commit from the page, confirmed; the consumer then receives the message
        assert NASTY_BODY not in scene.bodies()
        open_page(d, base + "transactions/" + quote(scene.transaction_id), "commit")
        click_and_wait(d, "commit", "confirm")
        d.find_element(By.ID, "reason").send_keys("customer paid, checked by hand")
        shot(d, "confirm")
        text = click_and_wait(d, "confirm", "notice")
        assert "committed" in d.find_element(By.ID, "notice").text, text
        assert "ok" in (d.find_element(By.ID, "notice").get_attribute("class") or "")
        shot(d, "committed")
        wait_until_sync(
            lambda: NASTY_BODY in scene.bodies(), PAGE_TIMEOUT, "billing to receive the commit"
        )
        t = scene.transaction()
        assert t["state"] == "COMMITTED" and t["decidedBy"] == "operator"
        assert t["remark"].endswith("customer paid, checked by hand"), t["remark"]

        # a form posted without this console's CSRF token changes nothing
        d.execute_script(
            "var f = document.createElement('form'); f.method = 'post';"
            "f.action = arguments[0]; document.body.appendChild(f); f.submit();",
            base + "transactions/" + quote(scene.transaction_id) + "/rollback",
        )
        wait_until_sync(lambda: "CSRF" in d.page_source, PAGE_TIMEOUT, "the CSRF refusal")
        assert scene.transaction()["state"] == "COMMITTED"

        # SIGTERM ends the console cleanly
        assert console.stop() == 0, console.output
    finally:
        console.stop()
        scene.close()


@pytest.fixture
def parking_broker(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    # two unanswered checks and the transaction is parked
    return broker_thread_factory(transaction_check_max=2)


def test_a_parked_transaction_is_resumed_then_rolled_back_from_its_page(
    parking_broker: BrokerThread, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    scene = Scene(parking_broker.address)
    console = ConsoleProcess(parking_broker.address)
    try:
        scene.build()
        wait_until_sync(
            lambda: scene.transaction()["state"] == "DISCARDED",
            PAGE_TIMEOUT,
            "the broker to park the transaction after its checks",
        )
        base = console.start()
        d = browser

        open_page(d, base + "transactions", "transactions")
        row = {r[0]: r for r in rows(d, "transactions")}[scene.transaction_id]
        assert row[1] == "PARKED", row
        assert rows(d, "by-group")[0][:4] == [TX_GROUP, TOPIC, "0", "1"]
        open_page(d, base, "txn-summary")
        assert kv_value(d, "txn-summary", "parked (checks exhausted)") == "1"

        # resume: the broker asks the producer again
        open_page(d, base + "transactions/" + quote(scene.transaction_id), "resume")
        assert kv_value(d, "txn", "state") == "PARKED"
        checks = scene.listener.checks
        click_and_wait(d, "resume", "confirm")
        click_and_wait(d, "confirm", "notice")
        assert "resumed" in d.find_element(By.ID, "notice").text
        wait_until_sync(
            lambda: scene.listener.checks > checks,
            PAGE_TIMEOUT,
            "the producer to be asked again after the resume",
        )

        # roll back: the message is dropped, never delivered
        open_page(d, base + "transactions/" + quote(scene.transaction_id), "rollback")
        click_and_wait(d, "rollback", "confirm")
        click_and_wait(d, "confirm", "notice")
        assert "rolled back" in d.find_element(By.ID, "notice").text
        assert scene.transaction()["state"] == "ROLLED_BACK"
        open_page(d, base + "transactions?state=ROLLED_BACK", "transactions")
        assert scene.transaction_id in {r[0] for r in rows(d, "transactions")}
        scene.send("after the rollback")
        wait_until_sync(
            lambda: "after the rollback" in scene.bodies(), PAGE_TIMEOUT, "the marker message"
        )
        assert NASTY_BODY not in scene.bodies()
    finally:
        console.stop()
        scene.close()


@pytest.fixture
def acl_broker(broker_thread_factory: Callable[..., BrokerThread], tmp_path: Path) -> BrokerThread:
    acl = write_acl(tmp_path, ACL_FILE)
    return broker_thread_factory(
        transaction_check_max=100_000, acl_enable=True, plain_acl_file=str(acl)
    )


def test_with_the_acl_on_a_read_only_account_sees_the_pages_but_cannot_commit(
    acl_broker: BrokerThread, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    scene = Scene(acl_broker.address, OPERATOR)
    console = ConsoleProcess(acl_broker.address, *OPERATOR)
    try:
        scene.build()
        base = console.start()
        d = browser

        # every page asks for a sign-in first; a wrong secret is refused
        open_page(d, base + "transactions", "login")
        assert "/login" in d.current_url
        cookie = d.get_cookie("txmq_console")
        assert cookie is not None and cookie["httpOnly"], cookie
        shot(d, "login")
        text = sign_in(d, ("viewer", "not-the-secret"), "login")
        assert "refused these credentials" in text and "bad signature" in text

        # the read-only account signs in and sees the data (read with the console's account)
        text = sign_in(d, VIEWER, "transactions")  # back where it was sent from
        assert d.find_element(By.ID, "user").text == "viewer"
        assert scene.transaction_id in {r[0] for r in rows(d, "transactions")}
        assert "secret-view-123" not in d.page_source
        for url, marker in (
            ("", "broker"),
            ("topics", "topics"),
            ("groups/audit", "lag"),
            ("messages?id=" + scene.offset_msg_id, "body"),
        ):
            open_page(d, base + url, marker)

        # its commit is refused by the broker, said plainly, and nothing is committed
        open_page(d, base + "transactions/" + quote(scene.transaction_id), "commit")
        click_and_wait(d, "commit", "confirm")
        text = click_and_wait(d, "confirm", "notice")
        notice = d.find_element(By.ID, "notice")
        assert "refused" in (notice.get_attribute("class") or ""), text
        assert "Refused" in notice.text and "viewer" in notice.text, notice.text
        assert "Nothing was changed" in notice.text
        assert "needs an admin account" in notice.text
        shot(d, "refused")
        assert scene.transaction()["state"] == "PENDING"
        assert NASTY_BODY not in scene.bodies()

        # the operator's account acts
        click_and_wait(d, "logout", "login")
        sign_in(d, OPERATOR, "broker")
        open_page(d, base + "transactions/" + quote(scene.transaction_id), "commit")
        click_and_wait(d, "commit", "confirm")
        click_and_wait(d, "confirm", "notice")
        assert "committed" in d.find_element(By.ID, "notice").text
        wait_until_sync(
            lambda: NASTY_BODY in scene.bodies(), PAGE_TIMEOUT, "billing to receive the commit"
        )
        assert scene.transaction()["state"] == "COMMITTED"
    finally:
        console.stop()
        scene.close()


def test_in_cluster_mode_the_overview_shows_role_epoch_and_in_sync_replicas(
    tmp_path: Path, browser: Any
) -> None:
    etcd_binary()  # or skip (fail under CI) saying how to get it
    etcd = EtcdCluster(tmp_path / "etcd", 1).start()
    bc = BrokerCluster(
        tmp_path / "cluster", etcd.endpoints, name=f"console{os.getpid()}", groups={"g1": 2}
    )
    console: ConsoleProcess | None = None
    try:
        leader = asyncio.run(bc.start_group("g1"))
        status = asyncio.run(bc.group_status("g1"))
        assert status is not None
        console = ConsoleProcess(leader.addr)
        base = console.start()
        d = browser
        open_page(d, base, "cluster")
        assert kv_value(d, "broker", "role") == f"leader (replica {leader.replica} of group g1)"
        [row] = rows(d, "cluster")
        assert row[0] == "g1"
        assert row[1] == f"replica {leader.replica} at {leader.addr}"
        assert row[2] == str(status["epoch"])
        assert row[4] == "0, 1", row  # both replicas in sync
        shot(d, "cluster")
    finally:
        if console is not None:
            console.stop()
        bc.stop_all()
        etcd.stop()


def test_screenshots_are_where_the_guide_shows_them() -> None:
    guide = (ROOT / "docs" / "console.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"\(console/([\w-]+\.png)\)", guide))
    assert shown, "docs/console.md shows no screenshot"
    missing = sorted(n for n in shown if not (SHOTS / n).exists())
    assert not missing, f"docs/console.md shows screenshots not in docs/console/: {missing}"
    assert os.path.isdir(SHOTS)

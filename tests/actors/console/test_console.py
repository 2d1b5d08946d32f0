"""The web console in a real headless browser (Debian's chromium and chromium-driver,
driven by Selenium) against the ``console`` actor of a real local cluster: every page
loads without a JavaScript error, shows the cluster's real data, and every form
refuses bad input without changing anything."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import ray
from aiohttp import web
from raymq_testkit import SMALL_STORE, printed_json, unique_namespace, wait_until
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

import actors
from actors import ConsumerFleet, ConsumeStatus, LocalTransactionState, TransactionProducer
from actors.client.admin import Admin
from actors.config.console import ConsoleConfig
from actors.console import build_app, pages
from actors.tools.cli import main as cli
from rebalance import MessageQueue
from storage import Message, codec, transaction
from storage.errors import InvalidConfigError

WAIT_S = 15.0
REFRESH_MS = 300
SAMPLE_MS = 250  # the console samples the brokers' counters this often
RATE_WINDOW_MS = 4000  # a rate is over the last 4 s of samples
JOB_CHUNK = 4  # a bulk resend tells its progress every 4 letters


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    namespace = unique_namespace("console")
    c = actors.start_cluster(
        namespace=namespace,
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("console")),
        broker_options={"store": SMALL_STORE, "heartbeat_interval_s": 2.0},
        console=ConsoleConfig(
            port=0,
            refresh_ms=REFRESH_MS,
            sample_interval_ms=SAMPLE_MS,
            # the ring must not fill while the module runs: a full one (120 samples are
            # 30 s at SAMPLE_MS) draws the same number of points at every refresh, and
            # the charts' self-refresh is checked by their points growing
            samples_kept=10_000,
            rate_window_ms=RATE_WINDOW_MS,
            job_chunk=JOB_CHUNK,
        ),
    )
    yield c
    c.shutdown(timeout_s=10.0)


@pytest.fixture(scope="module")
def base(cluster: actors.Cluster) -> str:
    url = cluster.console_url()
    assert url is not None and url.startswith("http://127.0.0.1:")
    return url.rstrip("/")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (.ci/run installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    b.set_page_load_timeout(WAIT_S)
    yield b
    b.quit()


# ------------------------------------------------------------ helpers
def problems(b: WebDriver, *, http_errors: bool) -> list[dict[str, Any]]:
    """The browser's log entries since the last call that tell of an error: JavaScript
    errors, CSP violations, failed loads (a refused form's 4xx page only if
    ``http_errors``)."""
    out = []
    for entry in b.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        if entry["source"] == "network" and not http_errors:
            continue
        out.append(entry)
    return out


def wait_loaded(b: WebDriver) -> None:
    WebDriverWait(b, WAIT_S).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def mark_page(b: WebDriver) -> None:
    """Mark the page shown now, so that ``wait_next_page`` can tell the next one."""
    b.execute_script("window.__consoleTestOld = true")


def wait_next_page(b: WebDriver) -> None:
    """Wait for the page after the marked one to be loaded. (Chromedriver may answer a
    call made mid-navigation with an error rather than with a stale element.)"""
    WebDriverWait(b, WAIT_S, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return !window.__consoleTestOld && document.readyState === 'complete'"
        )
    )


def open_page(b: WebDriver, url: str, *, ok: bool = True) -> None:
    """Open ``url``; the page (and its script and style) load with no error logged."""
    b.get(url)
    wait_loaded(b)
    assert problems(b, http_errors=ok) == [], f"browser errors on {url}"


def submit(
    b: WebDriver, form_id: str, fields: dict[str, str], *, ok: bool = True, confirm: bool = False
) -> None:
    """Fill in and submit a form (accepting its confirmation), and wait for the page it
    leads to."""
    form = b.find_element(By.ID, form_id)
    for name, value in fields.items():
        field = form.find_element(By.NAME, name)
        if field.tag_name == "select" or field.get_attribute("type") == "datetime-local":
            b.execute_script("arguments[0].value = arguments[1]", field, value)
        else:
            field.clear()
            field.send_keys(value)
    mark_page(b)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    if confirm:
        WebDriverWait(b, WAIT_S).until(ec.alert_is_present()).accept()
    wait_next_page(b)
    assert problems(b, http_errors=ok) == []


def text(b: WebDriver, element_id: str) -> str:
    """An element's text, read in one step (a refreshing part may be replaced meanwhile)."""
    value = b.execute_script(
        "var el = document.getElementById(arguments[0]); return el && el.innerText.trim()",
        element_id,
    )
    assert value is not None, f"no element #{element_id} on {b.current_url}"
    return str(value)


def rows(b: WebDriver, table_id: str) -> list[list[str]]:
    """A table's body cells, read in one step."""
    found = b.execute_script(
        "var t = document.getElementById(arguments[0]);"
        "return t && Array.from(t.querySelectorAll('tbody tr')).map("
        "  function (tr) { return Array.from(tr.cells).map("
        "    function (td) { return td.innerText.trim(); }); });",
        table_id,
    )
    assert found is not None, f"no table #{table_id} on {b.current_url}"
    return [list(r) for r in found]


def column(table: list[list[str]], i: int) -> list[str]:
    return [r[i] for r in table]


def wait_job_done(b: WebDriver) -> None:
    """On a job's page: its script polls the progress until the job ends; it must end
    done, with the bar full."""
    WebDriverWait(b, WAIT_S).until(lambda d: text(d, "job-state") != "running")
    assert text(b, "job-state") == "done", text(b, "job-message")
    assert text(b, "job-percent") == "100%"
    full = b.execute_script(
        "var p = document.getElementById('job-progress'); return [p.value, p.max]"
    )
    assert full[0] == full[1] >= 1
    assert problems(b, http_errors=True) == []


def reload_until(b: WebDriver, url: str, check: Any, what: str) -> Any:
    """Reload ``url`` until ``check(browser)`` is truthy (the console samples the
    brokers every SAMPLE_MS, so a rate shows within a few samples)."""

    def fresh() -> Any:
        open_page(b, url)
        return check(b)

    return wait_until(fresh, timeout_s=WAIT_S, interval_s=0.1, what=what)


# ------------------------------------------------------------ pages
def test_the_cluster_page_shows_nameservers_and_brokers(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    open_page(browser, base + "/")
    [ns] = rows(browser, "nameservers")
    assert ns[:2] == ["nameserver-0", "alive"] and "broker-a" in ns[2] and "broker-b" in ns[2]
    brokers = rows(browser, "brokers")
    status = {b["broker_name"]: b for b in cluster.admin.cluster_status()["brokers"]}
    assert column(brokers, 0) == ["broker-a", "broker-b"]
    for row in brokers:
        b = status[row[0]]
        assert row[1] == "0" and row[2].startswith("MASTER")
        assert row[3] == b["data_addr"] and ":" in row[3]  # the data path's own socket
        assert row[4] == b["addr"]
        assert row[6].startswith(f"{100 * b['disk_used_ratio']:.0f}% of ")
        assert row[13] == b["store_dir"]


def test_a_topic_is_created_with_the_form_and_shows_its_queues(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    open_page(browser, base + "/topics")
    submit(
        browser,
        "create-topic",
        {"name": "ConsoleOrders", "read_queues": "3", "write_queues": "3", "perm": "6"},
    )
    assert text(browser, "notice") == "created topic ConsoleOrders: 3 read / 3 write queues"
    assert browser.current_url == base + "/topics/ConsoleOrders"
    queues = rows(browser, "queues")
    assert sorted((r[0], r[1], r[2], r[3]) for r in queues) == [
        (b, str(q), "0", "0") for b in ("broker-a", "broker-b") for q in range(3)
    ]
    route = cluster.admin.topic_route("ConsoleOrders")
    assert sorted((q.broker_name, q.read_queue_nums) for q in route.queue_datas) == [
        ("broker-a", 3),
        ("broker-b", 3),
    ]

    submit(browser, "send-message", {"body": "hello from the console", "keys": "console-1"})
    assert text(browser, "notice").startswith("sent message ")
    held = sum(int(r[3]) - int(r[2]) for r in rows(browser, "queues"))
    assert held == 1
    [found] = cluster.admin.query_by_key("ConsoleOrders", "console-1")
    assert found.body == b"hello from the console"

    open_page(browser, base + "/topics")
    listed = {r[0]: r for r in rows(browser, "topics")}
    assert listed["ConsoleOrders"][:6] == [
        "ConsoleOrders",
        "6",
        "6",
        "RW-",
        "broker-a, broker-b",
        "1",
    ]

    # change it on every broker, then delete it (after a confirmation)
    open_page(browser, base + "/topics/ConsoleOrders")
    submit(browser, "update-topic", {"write_queues": "0"}, ok=False)
    assert "write queues=0: must be in 1..1024" in text(browser, "error")
    submit(browser, "update-topic", {"write_queues": "2", "perm": "4"})
    assert text(browser, "notice") == "updated topic ConsoleOrders: 3 read / 2 write queues, perm 4"
    assert rows(browser, "route") == [["broker-a", "3", "2", "R--"], ["broker-b", "3", "2", "R--"]]
    submit(browser, "delete-topic", {}, confirm=True)
    assert text(browser, "notice") == "deleted topic ConsoleOrders on broker-a, broker-b"
    assert "ConsoleOrders" not in column(rows(browser, "topics"), 0)
    assert "ConsoleOrders" not in cluster.admin.list_topics()


def test_the_topic_forms_refuse_bad_input_and_change_nothing(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    cluster.admin.create_topic("ConsoleKept", 1, 1, brokers=["broker-a"])
    before = set(cluster.admin.list_topics(include_system=True))
    for fields, why in [
        ({"name": "../x"}, "topic='../x': must match [A-Za-z0-9_%|-]{1,127}"),
        ({"name": "Fine", "read_queues": "0"}, "read queues=0: must be in 1..1024"),
        ({"name": "Fine", "write_queues": "many"}, "write queues='many': a whole number"),
        ({"name": "ConsoleKept"}, "topic 'ConsoleKept' exists already"),
        ({"name": "%DLQ%someone"}, "is a system name"),
    ]:
        open_page(browser, base + "/topics")
        submit(browser, "create-topic", fields, ok=False)
        assert why in text(browser, "error")
        assert set(cluster.admin.list_topics(include_system=True)) == before
    assert cluster.admin.topic_route("ConsoleKept").queue_datas[0].read_queue_nums == 1

    # a path that is not a topic name
    open_page(browser, base + "/topics/..%2Fx", ok=False)
    assert "must match" in text(browser, "error")

    # a 10 MB body: refused on the page, nothing sent
    open_page(browser, base + "/topics/ConsoleKept")
    browser.execute_script(  # hidden first: laying out 10 MB of text takes the browser seconds
        "var body = document.querySelector('#send-message textarea');"
        "body.classList.add('hidden'); body.value = 'x'.repeat(10 * 1024 * 1024);"
    )
    mark_page(browser)
    browser.find_element(By.CSS_SELECTOR, "#send-message button").click()
    wait_next_page(browser)
    assert problems(browser, http_errors=False) == []
    assert "the body is 10,485,760 bytes: the console sends at most 4,194,304" in text(
        browser, "error"
    )
    assert [r["max_offset"] for r in cluster.admin.topic_status("ConsoleKept")] == [0]

    # a forged form (no valid CSRF token): refused, nothing created
    open_page(browser, base + "/topics")
    browser.execute_script(
        "document.querySelector('#create-topic input[name=csrf]').value = 'forged'"
    )
    submit(browser, "create-topic", {"name": "ConsoleForged"}, ok=False)
    assert "security token is missing or stale" in text(browser, "error")
    assert "ConsoleForged" not in cluster.admin.list_topics()


def test_a_message_is_found_by_key_and_by_id_and_shown_as_text_and_hex(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    cluster.admin.create_topic("ConsoleMsgs", 2, 2)
    producer = cluster.producer("console-test-producer")
    try:
        sent = producer.send(
            Message("ConsoleMsgs", b"\x00\x01order 42 paid", tags="Paid", keys=["order-42"])
        )
    finally:
        producer.close()

    open_page(browser, base + "/messages")
    submit(browser, "by-key", {"topic": "ConsoleMsgs", "key": "order-42"})
    [row] = rows(browser, "found")
    assert row[0] == sent.msg_id and row[1] == "ConsoleMsgs" and row[3:5] == ["Paid", "order-42"]

    mark_page(browser)
    browser.find_element(By.LINK_TEXT, sent.msg_id).click()
    wait_next_page(browser)
    assert problems(browser, http_errors=True) == []
    props = dict((r[0], r[1]) for r in rows(browser, "properties"))
    assert props["KEYS"] == "order-42" and props["TAGS"] == "Paid"
    assert "order 42 paid" in text(browser, "body-text")
    assert not browser.find_element(By.ID, "body-hex").is_displayed()
    browser.find_element(By.CSS_SELECTOR, "[data-tab=body-hex]").click()
    WebDriverWait(browser, WAIT_S).until(ec.visibility_of_element_located((By.ID, "body-hex")))
    assert text(browser, "body-hex").startswith("00000000  00 01 6f 72 64 65 72")
    assert not browser.find_element(By.ID, "body-text").is_displayed()
    assert problems(browser, http_errors=True) == []

    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    for begin, end, expected in [
        ("2020-01-01T00:00:00", "2020-01-02T00:00:00", []),
        (hour_ago.strftime("%Y-%m-%dT%H:%M:%S"), "", [sent.msg_id]),
    ]:
        open_page(browser, base + "/messages")
        submit(
            browser,
            "by-key",
            {"topic": "ConsoleMsgs", "key": "order-42", "begin": begin, "end": end},
        )
        assert column(rows(browser, "found"), 0) == expected

    open_page(browser, base + "/messages")
    submit(browser, "by-id", {"id": sent.offset_msg_id})
    assert column(rows(browser, "found"), 0) == [sent.msg_id]

    for fields, why in [
        ({"id": "../../etc"}, "letters, digits, - and _ only"),
        ({"id": "0" * 32}, "no live broker has store host"),
    ]:
        open_page(browser, base + "/messages")
        submit(browser, "by-id", fields, ok=False)
        assert why in text(browser, "error")
    for fields, why in [
        ({"topic": "../x", "key": "k"}, "must match"),
        ({"topic": "NoSuchTopic", "key": "k"}, "NoSuchTopic"),
        (
            {
                "topic": "ConsoleMsgs",
                "key": "k",
                "begin": "2021-01-02T00:00",
                "end": "2021-01-01T00:00",
            },
            "the time range ends before it begins",
        ),
    ]:
        open_page(browser, base + "/messages")
        submit(browser, "by-key", fields, ok=False)
        assert why in text(browser, "error")


def test_a_group_s_lag_drops_to_zero_on_its_page_as_it_consumes(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic, group = "ConsoleLag", "console-billing"
    cluster.admin.create_topic(topic, 2, 2)
    producer = cluster.producer("console-lag-producer")
    try:
        producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(20)])
    finally:
        producer.close()
    consumer = cluster.pull_consumer(group)
    queues = consumer.fetch_subscribe_queues(topic)
    consumer.commit_offsets({mq: 0 for mq in queues})

    open_page(browser, base + "/groups")
    submit(browser, "find-group", {"group": group})
    assert browser.current_url == f"{base}/groups/{group}"
    assert text(browser, "total-lag") == "20"
    assert sum(int(r[5]) for r in rows(browser, "lag")) == 20

    next_offsets = {}
    for mq in queues:
        result = consumer.pull(mq, 0, max_count=100)
        next_offsets[mq] = result.next_offset
    assert sum(next_offsets.values()) == 20
    consumer.commit_offsets(next_offsets)
    # the page refreshes its lag itself (every REFRESH_MS): no reload
    WebDriverWait(browser, WAIT_S).until(lambda b: text(b, "total-lag") == "0")
    assert all(r[5] == "0" for r in rows(browser, "lag"))
    assert problems(browser, http_errors=True) == []
    consumer.close()

    # back to the earliest (after a confirmation): a job whose page shows its progress
    # until it is done; then the lag is back on the group's page
    submit(browser, "reset", {"topic": topic, "to": "earliest"}, confirm=True)
    assert "/jobs/" in browser.current_url
    wait_job_done(browser)
    assert text(browser, "job-message") == f"reset {group} on {topic} to earliest (4 queues)"
    assert text(browser, "job-count") == "4 of 4"
    mark_page(browser)
    browser.find_element(By.ID, "job-back").click()
    wait_next_page(browser)
    assert browser.current_url == f"{base}/groups/{group}"
    assert text(browser, "total-lag") == "20"
    submit(browser, "reset", {"topic": topic, "to": "time", "time": ""}, ok=False, confirm=True)
    assert "time='': a time as 2024-05-01T12:00:00 (UTC)" in text(browser, "error")
    assert sum(r["lag"] for r in cluster.admin.consumer_lag(group)) == 20

    open_page(browser, base + "/groups")
    submit(browser, "find-group", {"group": "nobody-here"}, ok=False)
    assert "group 'nobody-here' is unknown" in text(browser, "error")
    open_page(browser, base + "/groups/..%2Fx", ok=False)
    assert "group='../x': must match" in text(browser, "error")


def test_a_dead_letter_is_listed_resent_and_consumed_again(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic, group = "ConsoleDead", "console-dlq"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    producer = cluster.producer("console-dlq-producer")
    try:
        sent = producer.send(Message(topic, b"poison", tags="bad", keys=["dead-1"]))
    finally:
        producer.close()
    _, offset = codec.parse_offset_msg_id(sent.offset_msg_id)
    broker = cluster.broker("broker-a")
    assert ray.get(broker.consumer_send_msg_back.remote(group, [offset], 0)) == ["DLQ"]

    open_page(browser, base + "/dlq")
    submit(browser, "find-dlq", {"group": group})
    assert text(browser, "dlq-count") == "1"
    [letter] = rows(browser, "letters")
    assert letter[0] == sent.msg_id and letter[1] == topic and letter[4] == "dead-1"

    mark_page(browser)
    browser.find_element(By.CSS_SELECTOR, "#letters button[type=submit]").click()
    wait_next_page(browser)
    assert problems(browser, http_errors=True) == []
    assert text(browser, "notice") == f"resent 1 dead letter(s) of {group} to {topic}"

    consumer = cluster.pull_consumer(group)
    try:
        got = consumer.pull(MessageQueue(topic, "broker-a", 0), 0, max_count=10)
        assert [m.msg_id for m in got.messages] == [sent.msg_id, sent.msg_id]
        assert got.messages[1].keys == ("dead-1",) and got.messages[1].reconsume_times == 0
    finally:
        consumer.close()

    open_page(browser, base + "/groups")
    assert [group, "DLQ"] in rows(browser, "groups")

    open_page(browser, base + "/dlq?group=nobody-here", ok=False)
    assert "group 'nobody-here' has no dead-letter queue" in text(browser, "error")


def test_a_pending_transaction_is_listed_until_its_producer_rolls_it_back(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic, group = "ConsoleTxn", "console-txn"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-b"])

    class Undecided:
        def __init__(self) -> None:
            self.answer = LocalTransactionState.UNKNOW

        def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, msg: Message) -> LocalTransactionState:
            return self.answer

    listener = Undecided()
    producer = TransactionProducer(group, listener, namespace=cluster.namespace)
    try:
        # checkable at once (its own immunity: 0 s), not after the broker's 6 s
        immune = {transaction.PROP_CHECK_IMMUNITY: "0"}
        sent = producer.send_message_in_transaction(Message(topic, b"maybe", properties=immune))
        open_page(browser, base + "/transactions")
        [row] = [r for r in rows(browser, "pending") if r[2] == group]
        assert row[0] == "broker-b" and row[1] == sent.msg_id and row[3] == topic
        submit(browser, "find-txn", {"group": group})
        assert text(browser, "txn-count") == "1"
        # the broker checks it with its producer, who answers ROLLBACK: the list empties
        listener.answer = LocalTransactionState.ROLLBACK_MESSAGE
        assert ray.get(cluster.broker("broker-b").check_transactions.remote()) >= 1

        def emptied() -> bool:
            open_page(browser, base + "/transactions?group=" + group)
            return text(browser, "txn-count") == "0"

        wait_until(emptied, what="the rolled back transaction leaves the page")
    finally:
        producer.close()
    open_page(browser, base + "/transactions?group=bad%20group", ok=False)
    assert "must match" in text(browser, "error")


def test_the_transaction_coordinator_shows_its_producers_counters_and_undone_decisions(
    cluster: actors.Cluster, base: str, browser: WebDriver, tmp_path: Any
) -> None:
    assert 'id="coordinator-none"' in pages.transactions_page([], "", None)  # none runs yet
    topic = "ConsoleMtx"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    producer = cluster.transactional_producer(
        "console-mtx",
        "console-tid",
        coordinator_log_dir=str(tmp_path),
        one_phase=False,  # the coordinator decides: its page part counts the commit
    )
    alone = cluster.transactional_producer(  # one broker holds its transaction: no coordinator
        "console-mtx", "console-tid-alone", coordinator_log_dir=str(tmp_path)
    )
    try:
        with producer.begin() as txn:
            txn.send([Message(topic, b"in-a-transaction")])
        with alone.begin() as txn:
            txn.send([Message(topic, b"committed-by-broker-a-alone")])
        assert alone.one_phase_commits == 1
        open_page(browser, base + "/transactions")
        assert int(dict(rows(browser, "txn-one-phase"))["broker-a"]) >= 1
        assert ["console-tid", producer.producer_id, str(producer.epoch)] in rows(
            browser, "txn-producers"
        )
        summary = {r[0]: r[1] for r in rows(browser, "coordinator")}
        assert int(summary["committed"]) >= 1
        assert summary["decisions not applied everywhere yet"] == "0"
        assert text(browser, "txn-undone") == "(none)"
        # and the CLI says the same
        assert cli(["txn", "coordinator", "--namespace", cluster.namespace, "--json"]) == 0
    finally:
        producer.close()
        alone.close()


# ------------------------------------------------------------ rates, charts, long operations
def test_rates_and_charts_come_from_the_brokers_own_counters(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic, group = "ConsoleRates", "console-rates"
    cluster.admin.create_topic(topic, 2, 2, brokers=["broker-a"])
    producer = cluster.producer("console-rates-producer")
    try:
        producer.send_batch([Message(topic, b"r%d" % i) for i in range(40)])
    finally:
        producer.close()
    consumer = cluster.pull_consumer(group)
    try:
        queues = consumer.fetch_subscribe_queues(topic)
        consumer.commit_offsets({mq: 0 for mq in queues})
        done = {mq: consumer.pull(mq, 0, max_count=100).next_offset for mq in queues}
        assert sum(done.values()) == 40
        # half of it consumed: lag 20 on the group's charts, a consume rate above 0
        consumer.commit_offsets({mq: off // 2 for mq, off in done.items()})
    finally:
        consumer.close()

    def topic_row(b: WebDriver) -> list[str] | None:
        row = {r[0]: r for r in rows(b, "topics")}.get(topic)
        return row if row and row[6] and float(row[6].replace(",", "")) > 0 else None

    row = reload_until(browser, base + "/topics", topic_row, "a put TPS for the topic")
    assert row[5] == "40"  # messages held: the sum of max - min over its queues

    def broker_a(b: WebDriver) -> list[str] | None:
        found = [r for r in rows(b, "brokers") if r[0] == "broker-a"]
        return found[0] if found and found[0][10] and float(found[0][10]) > 0 else None

    row = reload_until(browser, base + "/", broker_a, "broker-a's put TPS")
    assert float(row[12]) > 0  # a mean put latency in ms, from its own timing

    reload_until(
        browser,
        f"{base}/groups/{group}",
        lambda b: float(text(b, "consume-tps")) > 0,
        "the group's consume TPS",
    )
    assert text(browser, "total-lag") == "20"

    def charted(b: WebDriver) -> dict[str, int] | None:
        points = b.execute_script(
            "var out = {}; document.querySelectorAll('figure.chart').forEach("
            "  function (f) { out[f.id] = parseInt(f.dataset.points, 10); }); return out"
        )
        return points if points["chart-put-tps"] > 1 and points["chart-lag"] > 1 else None

    points = reload_until(browser, base + "/metrics-charts", charted, "charts with points")
    assert set(points) == {
        "chart-put-tps",
        "chart-get-tps",
        "chart-put-ms",
        "chart-lag",
        "chart-consume",
    }
    legend = browser.find_element(By.ID, "chart-lag").text
    assert group in legend and "20" in legend  # the group's lag as last sampled
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-put-tps svg polyline")
    # the charts refresh themselves (no reload): more points come
    before = points["chart-put-tps"]
    # read in one script: the page's own refresh replaces the chart element, so a found
    # element may be stale by the time its attribute is asked for
    WebDriverWait(browser, WAIT_S).until(
        lambda b: (
            int(
                b.execute_script(
                    "var c = document.getElementById('chart-put-tps');"
                    "return c ? c.dataset.points : '0';"
                )
                or 0
            )
            > before
        )
    )
    assert problems(browser, http_errors=True) == []


def test_a_message_shows_json_which_groups_consumed_it_and_is_resent_to_one(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic = "ConsoleJson"
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-a"])
    producer = cluster.producer("console-json-producer")
    try:
        producer.send(Message(topic, b"first"))
        sent = producer.send(Message(topic, b'{"order": 7, "items": ["a"]}', keys=["j-7"]))
    finally:
        producer.close()
    mq = MessageQueue(topic, "broker-a", 0)
    consumer = cluster.pull_consumer("console-ate")
    idle = cluster.pull_consumer("console-idle")
    try:
        consumer.commit_offsets({mq: 2})  # past the JSON message (offset 1)
        idle.commit_offsets({mq: 1})  # consumed the first only

        open_page(browser, base + "/message?" + urllib.parse.urlencode({"id": sent.offset_msg_id}))
        assert browser.find_element(By.ID, "body-json").is_displayed()
        assert '"order": 7' in text(browser, "body-json")
        assert not browser.find_element(By.ID, "body-text").is_displayed()
        assert rows(browser, "consumed-by") == [
            ["console-ate", "2", "consumed"],
            ["console-idle", "1", "not yet"],
        ]

        submit(browser, "resend-to-group", {"group": "../x"}, ok=False)
        assert "group='../x': must match" in text(browser, "error")
        open_page(browser, base + "/message?" + urllib.parse.urlencode({"id": sent.offset_msg_id}))
        submit(browser, "resend-to-group", {"group": "console-idle"})
        assert text(browser, "notice") == (
            f"resent {sent.msg_id} to group console-idle: %RETRY%console-idle on broker-a"
        )
        # the group's retry topic holds the copy: that group alone consumes it again
        got = idle.pull(MessageQueue("%RETRY%console-idle", "broker-a", 0), 0, max_count=10)
        [copy] = got.messages
        assert copy.msg_id == sent.msg_id and copy.body == b'{"order": 7, "items": ["a"]}'
        assert copy.properties["RETRY_TOPIC"] == topic and copy.keys == ("j-7",)
    finally:
        consumer.close()
        idle.close()


def test_a_bulk_dead_letter_resend_shows_its_progress_to_100_percent(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic, group, n = "ConsoleBulk", "console-bulk", 10
    cluster.admin.create_topic(topic, 1, 1, brokers=["broker-b"])
    producer = cluster.producer("console-bulk-producer")
    try:
        sent = producer.send_batch([Message(topic, b"bulk-%d" % i) for i in range(n)])
    finally:
        producer.close()
    offsets = [codec.parse_offset_msg_id(r.offset_msg_id)[1] for r in sent]
    broker = cluster.broker("broker-b")
    assert ray.get(broker.consumer_send_msg_back.remote(group, offsets, 0)) == ["DLQ"] * n

    open_page(browser, base + "/dlq?group=" + group)
    assert text(browser, "dlq-count") == str(n)
    submit(browser, "resend-all", {}, confirm=True)
    job_url = browser.current_url
    assert job_url.startswith(base + "/jobs/")
    wait_job_done(browser)
    assert text(browser, "job-count") == f"{n} of {n}"
    assert text(browser, "job-message") == f"resent {n} dead letter(s) of {group} to {topic}"
    status, body = http(job_url + "/progress")
    progress = json.loads(body)
    assert status == 200 and progress["done"] == progress["total"] == n
    assert progress["percent"] == 100 and progress["state"] == "done"
    assert [r["max_offset"] for r in cluster.admin.topic_status(topic)] == [2 * n]

    open_page(browser, base + "/jobs/nosuchjob", ok=False)
    assert "no such job" in text(browser, "error")


def test_a_fleet_s_size_events_and_lag_chart_show_on_its_group_s_page(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    topic, group = "ConsoleFleet", "console-fleet"
    cluster.admin.create_topic(topic, 2, 2, brokers=["broker-a"])
    producer = cluster.producer("console-fleet-producer")
    try:
        producer.send_batch([Message(topic, b"f%d" % i) for i in range(30)])
    finally:
        producer.close()

    def listener(messages: list[Any]) -> ConsumeStatus:  # pickled by value into the member
        return ConsumeStatus.SUCCESS

    fleet = ConsumerFleet(
        group,
        topic,
        listener,
        namespace=cluster.namespace,
        min_consumers=1,
        max_consumers=1,
        interval_s=0.2,
        num_cpus=0,
        consumer_options={
            "rebalance_interval_s": 0.3,
            "heartbeat_interval_s": 0.3,
            "persist_offset_interval_s": 0.2,
            "pull_suspend_s": 1.0,
            "consume_from": "FIRST",
            "shutdown_timeout_s": 10.0,
        },
    )
    try:
        wait_until(
            lambda: (
                sum(r["lag"] for r in cluster.admin.consumer_lag(group, topic)) == 0
                and cluster.admin.consumer_lag(group, topic)
            ),
            timeout_s=30,
            what="the fleet consumed the backlog",
        )

        def fleet_shown(b: WebDriver) -> dict[str, str] | None:
            # the controller polls its members every interval_s (a poll slower than its
            # timeout keeps the last answer): the page may show the member running
            # before the poll that saw its queues
            summary = {r[0]: r[1] for r in rows(b, "fleet")}
            points = int(b.find_element(By.ID, "fleet-lag-chart").get_attribute("data-points"))
            held = [m[3] for m in rows(b, "fleet-members") if len(m) > 3]
            shown = summary["running"] == "1" and points > 0 and any(held)
            return summary if shown else None

        summary = reload_until(browser, f"{base}/groups/{group}", fleet_shown, "the fleet")
        assert summary["size"] == "1" and summary["min / max"] == "1 / 1"
        [member] = rows(browser, "fleet-members")
        assert member[0] == f"fleet-{group}-m1" and member[1] == "RUNNING"
        assert sorted(member[3].split(", ")) == [f"{topic}:broker-a:{q}" for q in (0, 1)]
        events = column(rows(browser, "fleet-events"), 1)
        assert "join" in events and events.index("join") < events.index("running")
        assert text(browser, "total-lag") == "0"
    finally:
        fleet.shutdown(timeout_s=30)


# ------------------------------------------------------------ access and the CLI
def test_a_console_on_another_address_needs_a_token() -> None:
    with pytest.raises(InvalidConfigError, match="give a token"):
        ConsoleConfig(host="0.0.0.0")
    with pytest.raises(InvalidConfigError, match="at least 8"):
        ConsoleConfig(host="0.0.0.0", auth="short")
    assert "s3cret-token" not in repr(ConsoleConfig(host="0.0.0.0", auth="s3cret-token"))


@pytest.fixture
def console_with_token(cluster: actors.Cluster) -> Iterator[str]:
    """The console application served in this process (as a test may), with a token."""
    app = build_app(
        ConsoleConfig(namespace=cluster.namespace, port=0, auth="s3cret-token"),
        Admin(cluster.namespace),
    )
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_with_a_token_every_page_waits_for_the_sign_in(
    console_with_token: str, browser: WebDriver
) -> None:
    open_page(browser, console_with_token + "/topics")
    assert browser.current_url == console_with_token + "/login?next=%2Ftopics"
    submit(browser, "login", {"token": "wrong-token"}, ok=False)
    assert text(browser, "error") == "wrong token"
    open_page(browser, console_with_token + "/topics")
    submit(browser, "login", {"token": "s3cret-token"})
    assert browser.current_url == console_with_token + "/topics"
    assert "ConsoleKept" in column(rows(browser, "topics"), 0)


def http(
    url: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """A request as a script (not a browser) makes it: no cookies, no redirects followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=WAIT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_scripts_use_a_bearer_token_and_no_post_passes_without_its_csrf_token(
    cluster: actors.Cluster, console_with_token: str
) -> None:
    bearer = {"Authorization": "Bearer s3cret-token"}
    assert http(console_with_token + "/topics")[0] == 303  # to the login page
    assert http(console_with_token + "/topics", headers={"Authorization": "Bearer nope"})[0] == 303
    status, page = http(console_with_token + "/topics", headers=bearer)
    assert status == 200 and "ConsoleKept" in page

    create = {"name": "ConsoleByScript", "read_queues": "1", "write_queues": "1", "perm": "6"}
    assert http(console_with_token + "/topics", create)[0] == 401  # not signed in
    status, page = http(console_with_token + "/topics", create, bearer)
    assert status == 403 and "security token is missing or stale" in page
    script = {**bearer, "Cookie": "raymq_csrf=" + "a" * 43}  # its own double-submit pair
    status, page = http(
        console_with_token + "/topics",
        {**create, "csrf": "a" * 43},
        {**script, "Origin": "http://evil.example"},
    )
    assert status == 403 and "came from another site" in page
    assert "ConsoleByScript" not in cluster.admin.list_topics()

    status, _ = http(console_with_token + "/topics", {**create, "csrf": "a" * 43}, script)
    assert status == 303  # token, cookie and form agree: created
    assert "ConsoleByScript" in cluster.admin.list_topics()


def test_raymq_console_and_status_print_the_console_url(
    cluster: actors.Cluster, base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ["--namespace", cluster.namespace]
    assert cli(["console", *ns, "--json"]) == 0
    out = printed_json(capsys.readouterr().out)
    assert out["url"] == base + "/" and out["already_running"] is True
    assert cli(["status", *ns]) == 0
    assert f"console: {base}/" in capsys.readouterr().out
    assert cli(["console", *ns, "--host", "0.0.0.0"]) == 1
    assert "give a token (--auth)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli(["console", *ns, "--port", "70000"])
    assert exit_info.value.code == 2


def test_raymq_up_console_prints_a_url_that_opens(
    ray_cluster: Any,
    tmp_path_factory: pytest.TempPathFactory,
    browser: WebDriver,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = ["--namespace", unique_namespace("console-up")]
    store = str(tmp_path_factory.mktemp("console-up"))
    up = ["up", *ns, "--nameservers", "1", "--brokers", "1", "--store-root", store]
    assert cli([*up, "--console", "--console-port", "0", "--json"]) == 0
    try:
        url = printed_json(capsys.readouterr().out)["console"]
        assert url.startswith("http://127.0.0.1:")
        open_page(browser, url)
        assert column(rows(browser, "brokers"), 0) == ["broker-a"]
    finally:
        assert cli(["down", *ns, "--keep-ray"]) == 0
    assert "console" in capsys.readouterr().out  # the console actor was stopped with the rest


def test_a_lite_parent_shows_its_lite_topics_by_page_and_each_one_s_groups(
    cluster: actors.Cluster, base: str, browser: WebDriver
) -> None:
    from actors.client.lite import LiteConsumer, LiteProducer

    open_page(browser, base + "/topics")
    submit(
        browser, "create-topic", {"name": "ConsoleSessions", "type": "LITE", "quota": "0"}, ok=False
    )
    assert "quota=0: must be in 1.." in text(browser, "error")
    assert "ConsoleSessions" not in cluster.admin.list_topics()
    submit(
        browser,
        "create-topic",
        {"name": "ConsoleSessions", "type": "LITE", "quota": "40", "ttl_ms": "600000"},
    )
    assert text(browser, "notice") == (
        "created LITE topic ConsoleSessions: quota 40 lite topics per broker, TTL 600000 ms"
    )
    assert browser.current_url == base + "/topics/ConsoleSessions"
    assert text(browser, "lite-summary").startswith("(0 of quota 80, 0.0% used")

    names = [f"s{i:03d}" for i in range(60)]
    with LiteProducer("ConsoleSessions", namespace=cluster.namespace) as producer:
        producer.send_batch([(n, n.encode()) for n in names])
        producer.send_batch([("s007", b"t1"), ("s007", b"t2")])
    consumer = LiteConsumer("console-gw", "ConsoleSessions", namespace=cluster.namespace)
    try:
        consumer.subscribe("s007")
        (batch,) = consumer.receive(1)
        consumer.ack(batch)

        open_page(browser, base + "/topics/ConsoleSessions")  # 50 a page, in name order
        assert column(rows(browser, "lite-topics"), 0) == names[:50]
        assert text(browser, "lite-page") == "50 shown of 60 next page"
        mark_page(browser)
        browser.find_element(By.ID, "lite-next").click()
        wait_next_page(browser)
        assert column(rows(browser, "lite-topics"), 0) == names[50:]
        assert text(browser, "lite-page") == "10 shown of 60"

        open_page(browser, base + "/topics")
        assert {r[0]: r[7] for r in rows(browser, "topics")}["ConsoleSessions"] == "LITE"

        open_page(browser, base + "/topics/ConsoleSessions")
        mark_page(browser)
        browser.find_element(By.LINK_TEXT, "s007").click()
        wait_next_page(browser)
        [offsets] = rows(browser, "lite-offsets")
        assert offsets[1:3] == ["0", "3"]
        assert rows(browser, "lite-groups") == [["console-gw", "1", "2", consumer.client_id]]

        # a quota below what a broker holds (about 30 each): refused, nothing changed
        open_page(browser, base + "/topics/ConsoleSessions")
        submit(browser, "lite-settings", {"quota": "10"}, ok=False)
        assert "quota=10 for LITE topic 'ConsoleSessions': broker" in text(browser, "error")
        assert cluster.admin.describe_lite_topic("ConsoleSessions")["quota"] == 80

        open_page(browser, base + "/topics/ConsoleSessions/lite/s007")
        submit(browser, "delete-lite-topic", {}, confirm=True)
        assert text(browser, "notice").startswith("deleted lite topic s007 of ConsoleSessions on")
        assert text(browser, "lite-summary").startswith("(59 of quota 80")
        open_page(browser, base + "/topics/ConsoleSessions/lite/s007", ok=False)
        assert "does not exist" in text(browser, "error")
        open_page(browser, base + "/topics/ConsoleSessions/lite/bad%2Fname", ok=False)
        assert "nothing was done" in text(browser, "error")
    finally:
        consumer.close()

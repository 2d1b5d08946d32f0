"""Remake the console screenshots in this folder: a local Ray and cluster with a little
traffic (a topic, a lagging group, a dead letter), each page taken by headless
Chromium (Debian's chromium and chromium-driver, as the console's tests use).

    python docs/console/make_screenshots.py
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import ray
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import actors
from actors.config.console import ConsoleConfig
from storage import Message, codec

HERE = Path(__file__).parent


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="raymq-shots-") as root:
        cluster = actors.start_cluster(
            namespace="raymq-console-shots",
            store_root=root,
            broker_options={"store": {"commitlog_file_size": 8 << 20}},
            console=ConsoleConfig(port=0, sample_interval_ms=500, rate_window_ms=3000),
        )
        try:
            shoot(cluster)
        finally:
            cluster.shutdown()
    ray.shutdown()


def shoot(cluster: actors.Cluster) -> None:
    cluster.admin.create_topic("Orders", 4, 4)
    producer = cluster.producer("order-service")
    sent = []
    for i in range(8):
        batch = [
            Message(
                "Orders",
                f'{{"order": {i * 25 + j}, "amount": {(i * 25 + j) * 3}.50}}'.encode(),
                tags="Paid",
                keys=[f"order-{i * 25 + j}"],
            )
            for j in range(25)
        ]
        sent += list(producer.send_batch(batch))
    producer.close()
    consumer = cluster.pull_consumer("billing")
    queues = consumer.fetch_subscribe_queues("Orders")
    consumer.commit_offsets({q: 0 for q in queues})
    for q in queues[:3]:
        consumer.commit(q, consumer.pull(q, 0, max_count=1000).next_offset)
    poison = sent[42]
    for dead in [poison, *sent[100:111]]:  # a dozen dead letters, for the bulk resend
        _, offset = codec.parse_offset_msg_id(dead.offset_msg_id)
        broker = cluster.broker(dead.message_queue.broker_name)
        ray.get(broker.consumer_send_msg_back.remote("billing", [offset], 0))
    traffic(cluster, consumer, queues)

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1440,900"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    base = (cluster.console_url() or "").rstrip("/")
    try:
        for name, path in [
            ("cluster", "/"),
            ("topics", "/topics"),
            ("topic", "/topics/Orders"),
            ("group", "/groups/billing"),
            ("message", f"/message?id={poison.offset_msg_id}&topic=Orders"),
            ("metrics", "/metrics-charts"),
            ("dlq", "/dlq?group=billing"),
        ]:
            browser.get(base + path)
            WebDriverWait(browser, 10).until(
                lambda d: d.execute_script("return document.readyState") == "complete"
            )
            if name == "message":  # the body as JSON and the groups that consumed it
                browser.execute_script("document.querySelector('.tabs').scrollIntoView()")
            save(browser, name)
        # the bulk resend: its job's page, once done
        browser.execute_script("window.confirm = function () { return true; }")
        browser.find_element(By.CSS_SELECTOR, "#resend-all button").click()
        WebDriverWait(browser, 20).until(
            lambda d: (
                d.execute_script(
                    "var s = document.getElementById('job-state'); return s && s.textContent"
                )
                == "done"
            )
        )
        save(browser, "job")
    finally:
        browser.quit()


def save(browser: webdriver.Chrome, name: str) -> None:
    browser.save_screenshot(str(HERE / f"{name}.png"))
    print(f"{HERE / name}.png")


def traffic(cluster: actors.Cluster, consumer: actors.PullConsumer, queues: list) -> None:
    """Twelve seconds of sends and of the group consuming behind them, so that the
    console's samples have rates and its charts lines."""
    producer = cluster.producer("order-service")
    nxt = {q: consumer.pull(q, 0, max_count=1000).next_offset for q in queues[:3]}
    deadline = time.monotonic() + 12
    n = 1000
    while time.monotonic() < deadline:
        step = 20 + int(15 * math.sin(n / 40))
        producer.send_batch(
            [Message("Orders", f'{{"order": {n + j}}}'.encode()) for j in range(step)]
        )
        n += step
        for q in nxt:  # the group keeps up on three queues, not on the fourth
            got = consumer.pull(q, nxt[q], max_count=16)
            nxt[q] = got.next_offset
            consumer.commit(q, nxt[q])
        time.sleep(0.25)
    producer.close()


if __name__ == "__main__":
    main()

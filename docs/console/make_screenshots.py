"""Remake the console screenshots in this folder: a local Ray and cluster with a little
traffic (a topic, a lagging group, a dead letter), each page taken by headless
Chromium (Debian's chromium and chromium-driver, as the console's tests use).

    python docs/console/make_screenshots.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import ray
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
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
            console=ConsoleConfig(port=0),
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
    _, offset = codec.parse_offset_msg_id(poison.offset_msg_id)
    broker = cluster.broker(poison.message_queue.broker_name)
    ray.get(broker.consumer_send_msg_back.remote("billing", [offset], 0))

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,800"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    base = (cluster.console_url() or "").rstrip("/")
    try:
        for name, path in [
            ("cluster", "/"),
            ("topic", "/topics/Orders"),
            ("group", "/groups/billing"),
            ("message", f"/message?id={poison.offset_msg_id}&topic=Orders"),
            ("dlq", "/dlq?group=billing"),
        ]:
            browser.get(base + path)
            WebDriverWait(browser, 10).until(
                lambda d: d.execute_script("return document.readyState") == "complete"
            )
            browser.save_screenshot(str(HERE / f"{name}.png"))
            print(f"{HERE / name}.png")
    finally:
        browser.quit()


if __name__ == "__main__":
    main()

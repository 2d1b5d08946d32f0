"""The official Python client over TLS (``tls_enable=True``), in a process of its own:
its channel trusts only the default roots, which grpc reads once per process from
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``; the test gives it the broker's self-signed
certificate there. Sends one message, receives it with a SimpleConsumer, acks it, and
prints ``{"sent": id, "got": [[id, body], ...]}``.

Usage: python official_tls_client.py '{"addr": ..., "ak": ..., "sk": ..., "topic": ...,
"group": ...}'"""

from __future__ import annotations

import json
import sys
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)


def main() -> None:
    args = json.loads(sys.argv[1])
    config = ClientConfiguration(args["addr"], Credentials(args["ak"], args["sk"]))
    producer = Producer(config, (args["topic"],), tls_enable=True)
    producer.startup()
    try:
        m = Message()
        m.topic = args["topic"]
        m.body = b"sealed by the official client"
        sent = producer.send(m).message_id
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(
        config, args["group"], {args["topic"]: FilterExpression()}, 1, tls_enable=True
    )
    consumer.startup()
    got: list[list[str]] = []
    try:
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            for r in consumer.receive(16, 20):
                got.append([r.message_id, r.body.decode()])
                consumer.ack(r)
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "got": got}))


if __name__ == "__main__":
    main()

"""LLM-like token streams per session through lite topics, resumed after a drop.

    python examples/lite_token_stream.py

A Ray Serve deployment, ``Generator``, answers a prompt by writing its reply token by
token to the lite topic of the session (one lite topic per session, in the parent
``Sessions`` of type LITE), as a model server streams. A gateway reads each session's
tokens as they come and keeps, per session, the offset of the next token. When its
connection drops, a new gateway resumes from that offset and gets exactly the
tokens after it, in order, even those written while no gateway was there.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import ray
from ray import serve

import actors
from actors.client.lite import LiteConsumer, LiteProducer

PARENT = "Sessions"
END = "<eos>"
REPLY = (
    "Lite topics give every session its own ordered stream inside one parent topic, "
    "so a gateway that lost its connection resumes from the last token it saw."
)


def reply_tokens(session: str) -> list[str]:
    """What the model answers in ``session``: words, then the end of the stream."""
    return [f"{w} " for w in f"[{session}] {REPLY}".split()] + [END]


@serve.deployment
class Generator:
    """Streams a reply to the session's lite topic, one token per send."""

    def __init__(self, namespace: str) -> None:
        self.producer = LiteProducer(PARENT, namespace=namespace)

    def generate(self, session: str, token_delay_s: float) -> int:
        tokens = reply_tokens(session)
        for token in tokens:
            time.sleep(token_delay_s)  # the model computing the next token
            self.producer.send(session, token.encode())
        return len(tokens)


class Gateway:
    """Reads sessions' streams for clients; ``offsets`` is where each client stands."""

    def __init__(self, namespace: str, offsets: dict[str, int] | None = None) -> None:
        self.consumer = LiteConsumer("gateway", PARENT, namespace=namespace)
        self.offsets = dict(offsets or {})
        self.text: dict[str, list[str]] = {}

    def poll(self, session: str, max_tokens: int = 64, wait_s: float = 0.0) -> list[str]:
        """The session's tokens since the last poll; none yet: the broker holds the pull
        up to ``wait_s`` for the next one (then an empty list)."""
        offset = self.offsets.get(session, 0)
        batch = self.consumer.pull(session, offset, max_tokens, wait_s=wait_s)
        tokens = [m.body.decode() for m in batch.messages]
        self.offsets[session] = batch.next_offset
        self.text.setdefault(session, []).extend(tokens)
        return tokens

    def follow(self, session: str, stop_after: int | None = None, timeout_s: float = 30.0) -> None:
        """Poll ``session`` until its end (or ``stop_after`` tokens in this gateway)."""
        deadline = time.monotonic() + timeout_s
        while (self.text.get(session) or [""])[-1] != END:
            room = 64 if stop_after is None else stop_after - len(self.text.get(session, []))
            if room <= 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {session}: no end of stream in {timeout_s} s")
            self.poll(session, max_tokens=room, wait_s=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.consumer.close()


def run(cluster: actors.Cluster, sessions: int = 3, token_delay_s: float = 0.005) -> dict:
    """Stream a reply in each session; the first gateway drops after 5 tokens of each,
    a second one resumes from its offsets. Returns, per session, what the first
    gateway got, what the second got and the offset it resumed from."""
    cluster.admin.create_lite_topic(PARENT, quota=100_000, ttl_ms=600_000)
    serve.start(proxy_location="Disabled")
    handle = serve.run(Generator.bind(cluster.namespace), name="generator", route_prefix=None)
    names = [f"chat-{i}" for i in range(sessions)]
    try:
        streams = [handle.generate.remote(s, token_delay_s) for s in names]
        first = Gateway(cluster.namespace)
        for s in names:
            first.follow(s, stop_after=5)
        kept = dict(first.offsets)  # what the clients were told before the drop
        got_first = {s: list(first.text[s]) for s in names}
        first.close()  # the connection drops; the model keeps writing
        counts = [r.result(timeout_s=60) for r in streams]
        second = Gateway(cluster.namespace, offsets=kept)
        for s in names:
            second.follow(s)
        second.close()
        return {
            s: {"first": got_first[s], "resumed_at": kept[s], "second": second.text[s], "n": n}
            for s, n in zip(names, counts)
        }
    finally:
        serve.delete("generator")


def check(result: dict) -> list[str]:
    """Problems: a session whose tokens before and after the drop are not its reply."""
    return [
        f"session {s}: {r['first'] + r['second']!r}"
        for s, r in result.items()
        if r["first"] + r["second"] != reply_tokens(s) or r["resumed_at"] != len(r["first"])
    ]


def main() -> int:
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    root = tempfile.mkdtemp(prefix="raymq-lite-stream-")
    cluster = actors.start_cluster(namespace="lite-stream-demo", store_root=root)
    try:
        result = run(cluster)
        for session, r in result.items():
            print(f"{session}: the gateway showed {len(r['first'])} tokens, dropped, resumed")
            print(f"  at offset {r['resumed_at']} and got the other {len(r['second'])} in order:")
            print("  " + "".join(r["first"]) + "| " + "".join(r["second"]))
        problems = check(result)
        print(problems or "every session resumed exactly after its offset")
        return 1 if problems else 0
    finally:
        serve.shutdown()
        cluster.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

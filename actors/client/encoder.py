"""Validating and encoding a send's messages into chunks, on the client.

Messages are validated and encoded here with the store's own rules and errors
(``storage.codec.encode_batch``), so a bad message raises before anything is
sent, and the broker copies the records as they are. What comes out is a list
of :class:`~actors.client.send_result._Chunk`, each one call's worth:

* one topic per chunk (a send of several topics is split by topic), never a
  system topic;
* at most ``max_batch_messages`` messages and about ``max_batch_bytes`` encoded
  bytes per chunk (a single message larger than that goes alone);
* every message of the caller's list in exactly one chunk, and ``positions``
  maps each chunk's records back to their indexes in that list, so results come
  back in the caller's order.

An idempotent producer's encoder (given its :class:`Sequencer`) reserves, once the
producer has its id, a ``PRODUCER_SEQ`` slot in each plain chunk's first record
(``storage.codec.seq_slot``): binding the chunk to a queue's sequences then patches
those few bytes in place instead of copying the chunk (``EncodedBatch.with_sequence``).

No Ray and no cluster here: an encoder needs only a :class:`ProducerConfig`.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import time
from collections.abc import Mapping, Sequence

import numpy as np

from actors.client.idempotence import Sequencer
from actors.client.send_result import _Chunk
from actors.config.client import ProducerConfig
from actors.protocol.topic import SYSTEM_TOPICS
from storage import codec
from storage._fast_encode import encode_plain
from storage.codec import EncodedBatch, encode_batch
from storage.errors import InvalidMessageError
from storage.message import Message

_ONE = np.arange(1)
_ONE.flags.writeable = False


def _positions(n: int) -> np.ndarray:
    """``0 .. n-1``: a single message's (the most common send) shared, read-only."""
    return _ONE if n == 1 else np.arange(n)


class MessageEncoder:
    """Turns a send's messages (or batches encoded already) into chunks; see the module doc."""

    def __init__(self, config: ProducerConfig, sequencer: Sequencer | None = None) -> None:
        self.config = config
        self.sequencer = sequencer
        self._uniq = codec.UniqueKeyGenerator()
        self._born = codec.host_to_bytes(config.born_host)
        self._slot: tuple[str, bytes] | None = None  # (producer id, its PRODUCER_SEQ slot)

    def _seq_slot(self) -> bytes | None:
        """The slot to reserve: none before the producer has its id (its first send)."""
        pid = self.sequencer.producer_id if self.sequencer is not None else None
        if pid is None:
            return None
        if self._slot is None or self._slot[0] != pid:
            self._slot = (pid, codec.seq_slot(pid))
        return self._slot[1]

    def encode(
        self,
        messages: Sequence[Message],
        numbered: bool = True,
        shared: Mapping[str, str] | None = None,
    ) -> list[_Chunk]:
        """Validate and encode: one chunk per topic and size limit, in the caller's order.
        ``numbered=False``: chunks an idempotent producer will not bind (oneway sends).
        ``shared``: properties every message carries on top of its own (a transaction's
        marks), encoded once for a batch of messages with none of their own."""
        if not messages:
            raise InvalidMessageError("send needs at least one message")
        cfg = self.config
        first = messages[0]
        if (
            len(messages) <= cfg.max_batch_messages
            and first.__class__ is Message
            and first.topic.__class__ is str
            and first.topic not in SYSTEM_TOPICS
        ):
            # the usual batch (one topic, plain, one call's worth) in one pass: the plain
            # encoder checks every message is a Message of the first one's topic
            batch = encode_plain(
                messages,
                cfg.max_message_size,
                int(time.time() * 1000),
                self._born,
                self._uniq,
                self._seq_slot() if numbered else None,
                shared,
            )
            if batch is not None and len(batch.data) <= cfg.max_batch_bytes:
                return [_Chunk(first.topic, batch, _positions(len(messages)))]
        if shared:  # the general loop: each message with the shared properties as its own
            messages = [
                dataclasses.replace(
                    m, properties={**m.properties, **shared} if m.properties else shared
                )
                if isinstance(m, Message)
                else m
                for m in messages
            ]
        for i, m in enumerate(messages):
            if m.__class__ is not Message and not isinstance(m, Message):
                raise InvalidMessageError(
                    f"message {i}: expected storage.Message, got {type(m).__name__}"
                )
        topics = [m.topic for m in messages]
        by_topic: dict[str, list[int]]
        if len(set(topics)) == 1:
            by_topic = {topics[0]: list(range(len(messages)))}
        else:
            by_topic = {}
            for i, t in enumerate(topics):
                by_topic.setdefault(t, []).append(i)
        chunks = []
        for topic, positions in by_topic.items():
            codec.validate_topic(topic)
            if topic in SYSTEM_TOPICS:
                raise InvalidMessageError(f"topic={topic!r} is reserved for the system")
            for picked in self._cut(messages, positions):
                whole = len(picked) == len(messages)
                batch = encode_batch(
                    messages if whole else [messages[i] for i in picked],
                    max_message_size=cfg.max_message_size,
                    born_host=cfg.born_host,
                    uniq=self._uniq,
                )
                where = np.arange(len(picked)) if whole else np.array(picked, dtype=np.int64)
                chunks.append(_Chunk(topic, batch, where))
        return chunks

    def encoded(self, batches: Sequence[EncodedBatch]) -> list[_Chunk]:
        """Batches encoded already (one topic each, e.g. by ``actors.bridge.arrow_codec``)
        checked and taken as chunks, one per batch, positions running on from one batch
        to the next."""
        chunks, first = [], 0
        for batch in batches:
            if len(batch.topics) != 1:
                raise InvalidMessageError(f"an encoded batch has topics {batch.topics}: need one")
            codec.validate_topic(batch.topics[0])
            if batch.topics[0] in SYSTEM_TOPICS:
                raise InvalidMessageError(f"topic={batch.topics[0]!r} is reserved for the system")
            batch.check_structure()
            chunks.append(_Chunk(batch.topics[0], batch, np.arange(first, first + len(batch))))
            first += len(batch)
        if not chunks:
            raise InvalidMessageError("send needs at least one message")
        return chunks

    def _cut(self, messages: Sequence[Message], positions: list[int]) -> list[list[int]]:
        """Split into runs of at most ``max_batch_messages`` and about ``max_batch_bytes``."""
        cfg = self.config
        n = len(positions)
        if n <= cfg.max_batch_messages and n == len(messages):
            try:  # the usual batch fits whole: one sum instead of a running total
                if sum(map(len, [m.body for m in messages])) + 160 * n <= cfg.max_batch_bytes:
                    return [positions]
            except TypeError:
                pass
        try:
            cum = list(itertools.accumulate(len(messages[i].body) + 160 for i in positions))
        except TypeError:  # a body without a length: encode_batch names it
            cum = list(range(1, len(positions) + 1))
        out, start = [], 0
        while start < n:
            base = cum[start - 1] if start else 0
            stop = bisect.bisect_right(cum, base + cfg.max_batch_bytes, start, n)
            stop = max(start + 1, min(stop, start + cfg.max_batch_messages))
            out.append(positions[start:stop])
            start = stop
        return out

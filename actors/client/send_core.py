"""The parts of sending that sync and async sends share: binding a chunk to its queue,
making the call through the transport, and telling the fault tolerance how it went.
The sync path is :class:`~actors.client.sender.Sender`'s, the async one
:class:`~actors.client.send_async.AsyncSending`'s."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Sequence

from actors.client.backpressure import AsyncSendBudget
from actors.client.fault import LATENCY_MAX_S, LatencyFaultTolerance
from actors.client.idempotence import Sequencer
from actors.client.queue_selector import QueueSelector
from actors.client.send_lanes import SendLanes
from actors.client.send_outcome import Delayed, NotSent, Pinned, pinned_route
from actors.client.send_result import _Chunk
from actors.client.transport import Reply, Transport
from actors.config.client import ProducerConfig
from actors.protocol.route import TopicRouteData
from actors.protocol.shared_future import new_lock
from rebalance import MessageQueue
from storage.codec import EncodedBatch
from storage.errors import (
    BrokerUnavailableError,
)

log = logging.getLogger("raymq.actors.producer")


class SenderCore:
    """What a sender holds and the steps of one call; see the module doc."""

    def __init__(
        self,
        config: ProducerConfig,
        selector: QueueSelector,
        transport: Transport,
        fault: LatencyFaultTolerance,
        budget: AsyncSendBudget,
        sequencer: Sequencer | None = None,
    ) -> None:
        self.config = config
        self.sequencer = sequencer
        self._later = Delayed()
        self.selector = selector
        self.transport = transport
        self.fault = fault
        self.budget = budget
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="raymq-producer")
        self._futures = new_lock()  # the async sends' futures share it
        self._lanes = SendLanes(
            config.max_in_flight_per_broker,
            max_messages=4 * config.max_batch_messages,
            max_bytes=2 * config.max_batch_bytes,
        )

    def close(self) -> None:
        """Let the retry threads finish and stop them (answers still out are not waited)."""
        self._later.close()
        self._pool.shutdown(wait=True)

    def send_oneway(self, chunks: Sequence[_Chunk]) -> None:
        """Send each chunk once; no answer is awaited and no failure is reported (nor
        numbered: a oneway send lost would leave a gap its queue waits for)."""
        for chunk in chunks:
            try:
                mq, route, auto_n = self.selector.select(chunk.topic, None, None)
                self._call(route, mq.broker_name, [chunk.batch.with_queue(mq.queue_id)], auto_n)
            except Exception as exc:  # noqa: BLE001 - oneway never reports
                log.debug("oneway send failed: %s", exc)

    def _bind(self, chunk: _Chunk, mq: MessageQueue, route: TopicRouteData) -> EncodedBatch:
        """The chunk bound for ``mq`` (numbered, for an idempotent producer)."""
        if self.sequencer is None:
            return chunk.batch.with_queue(mq.queue_id)
        return self.sequencer.bind(chunk.batch, mq, route)

    def _send(
        self, chunk: _Chunk, mq: MessageQueue, route: TopicRouteData, auto_n: int
    ) -> tuple[Reply, float, Pinned]:
        bound = self._bind(chunk, mq, route)
        try:
            ref = self._call(route, mq.broker_name, [bound], auto_n)
        except BaseException:
            if self.sequencer is not None:  # not sent: its sequences are free again
                self.sequencer.release(bound, mq)
            raise
        if auto_n:
            self.selector.created(chunk.topic)  # next time ask for the real route
        return ref, time.monotonic(), bound if self.sequencer is not None else None

    def _submit(
        self, chunk: _Chunk, avoid: str | None, sharding_key: str | None, refresh: bool = False
    ) -> tuple[MessageQueue, Reply, float, Pinned]:
        mq, route, auto_n = self.selector.select(chunk.topic, avoid, sharding_key, refresh)
        return (mq, *self._send(chunk, mq, route, auto_n))

    def _resend(self, chunk: _Chunk, mq: MessageQueue, pinned: EncodedBatch) -> Reply:
        """A pinned chunk again, as it was, to its queue's broker group (its master now).
        A topic with no route (its only broker restarting) is the broker unavailable."""
        with pinned_route():
            route, _ = self.selector.route(chunk.topic)
        return self._call(route, mq.broker_name, [pinned], 0)

    def _answered_in(self, chunk: _Chunk, mq: MessageQueue, latency_s: float) -> None:
        """The latency of an answer, to the fault tolerance: a slow one isolates the
        master it came from."""
        if latency_s < LATENCY_MAX_S[2]:  # fast enough to isolate nothing
            self.fault.update(mq.broker_name, latency_s)
        else:
            master = self.selector.master_of(chunk.topic, mq.broker_name)
            self.fault.update(mq.broker_name, latency_s, master=master)

    def _send_wire(self, route: TopicRouteData, broker_name: str, *batches: EncodedBatch) -> Reply:
        """A lane's call: ``batches`` (bound for their queues already) to ``broker_name``,
        through the broker's shared ring when it runs on this node. A call that could not
        be made raises :class:`NotSent` (its batches may go elsewhere)."""
        try:
            return self._call(route, broker_name, batches, 0)
        except Exception as exc:
            raise NotSent(str(exc)) from exc

    def _call(
        self,
        route: TopicRouteData,
        broker_name: str,
        batches: Sequence[EncodedBatch],
        auto_n: int,
    ) -> Reply:
        """The transport's call; a broker it cannot reach is marked failed first."""
        try:
            return self.transport.call(route, broker_name, batches, auto_n)
        except BrokerUnavailableError:
            master = self.selector.master_in(route, broker_name)
            self.fault.update(broker_name, 0.0, failed=True, master=master)
            raise

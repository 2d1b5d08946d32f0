"""The producer's sender on its own: retries and fault marking over a stand-in transport
whose answers are plain futures (no Ray cluster)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

import numpy as np
import pytest
from ray.exceptions import RayActorError
from test_queue_selector import RW, Routes, route

from actors.client.backpressure import AsyncSendBudget
from actors.client.encoder import MessageEncoder
from actors.client.fault import LatencyFaultTolerance
from actors.client.queue_selector import QueueSelector
from actors.client.send_result import _Chunk
from actors.client.sender import Sender
from actors.config.client import ProducerConfig
from actors.protocol.route import TopicRouteData
from actors.protocol.shared_ring import SharedCall
from actors.protocol.wire import SendAck
from storage import Message
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError, InvalidMessageError
from storage.message import PutStatus


class Transport:
    """Answers at once: an ack, the error given for a broker, or no call at all."""

    def __init__(self, **failing: BaseException) -> None:
        self.failing = failing
        self.calls: list[tuple[str, int]] = []  # broker, records

    def call(
        self,
        route: TopicRouteData,
        broker_name: str,
        batches: Sequence[EncodedBatch],
        auto_n: int,
    ) -> SharedCall:
        exc = self.failing.get(broker_name)
        if isinstance(exc, BrokerUnavailableError):
            raise exc  # unreachable: no call made
        n = sum(len(b) for b in batches)
        self.calls.append((broker_name, n))
        answer: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        if exc is not None:
            answer.set_exception(exc)
        else:
            ack = SendAck(
                PutStatus.PUT_OK, broker_name, "10.0.0.1:10911", np.arange(n), np.arange(n)
            )
            answer.set_result(ack.to_wire())
        return SharedCall(answer)

    def close(self) -> None:
        pass


def sender(transport: Transport, **options: object) -> Sender:
    config = ProducerConfig(**options)  # type: ignore[arg-type]
    fault = LatencyFaultTolerance()
    selector = QueueSelector(Routes(route("T", ("a", 1, RW), ("b", 1, RW))), fault, config)  # type: ignore[arg-type]
    return Sender(config, selector, transport, fault, AsyncSendBudget(1000, 1 << 20))


def chunks(n: int = 3) -> list[_Chunk]:
    return MessageEncoder(ProducerConfig()).encode([Message("T", b"m%d" % i) for i in range(n)])


@pytest.mark.parametrize(
    ("failure", "reread"),
    [(RayActorError(), ["T"]), (BrokerUnavailableError("gone"), [])],
    ids=["lost", "unreachable"],
)
def test_a_send_lost_on_the_way_goes_again_to_the_other_broker(
    failure: BaseException, reread: list[str]
) -> None:
    transport = Transport(a=failure)
    s = sender(transport)
    result = s.send_chunks(chunks(), 3, None, 1.0)
    assert {r.message_queue.broker_name for r in result} == {"b"}
    assert [r.queue_offset for r in result] == [0, 1, 2]
    assert not s.fault.is_available("a") and s.fault.is_available("b")
    assert s.selector.ns.invalidated == reread  # type: ignore[attr-defined]  # a lost answer
    s.close()


def test_a_send_the_broker_refused_is_not_retried() -> None:
    transport = Transport(a=InvalidMessageError("no"), b=InvalidMessageError("no"))
    s = sender(transport)
    with pytest.raises(InvalidMessageError):
        s.send_chunks(chunks(), 3, None, 1.0)
    assert len(transport.calls) == 1
    s.close()


def test_retries_give_up_after_retry_times_when_send_failed() -> None:
    transport = Transport(a=RayActorError(), b=RayActorError())
    s = sender(transport, retry_times_when_send_failed=1)
    with pytest.raises(BrokerUnavailableError, match="after 2 attempt"):
        s.send_chunks(chunks(), 3, None, 1.0)
    assert len(transport.calls) == 2
    s.close()


def test_an_async_send_lost_on_the_way_is_retried_and_answered_once() -> None:
    transport = Transport(a=RayActorError())
    s = sender(transport)
    result = s.send_chunks_async(chunks(), 3, budgeted=True).result(timeout=10)
    assert {r.message_queue.broker_name for r in result} == {"b"}
    assert s.budget.in_flight == (0, 0)  # the room it took is given back
    single = s.send_chunks_async(chunks(1), 1, single=True).result(timeout=10)
    assert single.message_queue.broker_name == "b"
    s.close()

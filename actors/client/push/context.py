"""What the push consumer's services see of the consumer, and of each other.

The :class:`~actors.client.push.consumer.PushConsumer` builds its services
(pulling, consuming, sending back, rebalancing) and hands each of them itself.
A service knows the consumer only as the protocol named here for it, exactly
the surface it uses, and the other services only as :class:`Pulls`,
:class:`Consumes` and :class:`SendsBack`. So imports go one way: the consumer
(the package's composition root) imports the services, the services import
this module, and no service imports the consumer or another service it calls
(the orderly consume service extends the concurrent one, and the coordinated
rebalance borrows the uncoordinated one's start offsets: those are uses, not
callbacks).

The consumer satisfies every protocol here structurally; mypy checks it where
the consumer hands itself to each service.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from actors.client.instance import ClientView
from actors.client.push.config import Listener, PushConsumerConfig
from actors.client.push.offset_store import OffsetStore
from actors.client.push.process_queue import ProcessQueue
from actors.client.push.timer import Counters, Scheduler
from rebalance import MessageQueue
from storage.message import MessageExt

# ---------------------------------------------------------------- the services, as peers


class Pulls(Protocol):
    """The pull service, as a service that wants a queue pulled sees it."""

    def request(self, pq: ProcessQueue) -> None: ...


class Consumes(Protocol):
    """The consume service, as the pull and send-back services see it."""

    def dispatch(self, pq: ProcessQueue) -> None: ...

    def forget(self, pq: ProcessQueue, batch: Sequence[MessageExt]) -> None: ...

    def retry_locally(
        self, pq: ProcessQueue, batch: Sequence[MessageExt], delay_s: float
    ) -> None: ...


class SendsBack(Protocol):
    """The send-back service, as the consume service sees it."""

    def submit(self, pq: ProcessQueue, batch: Sequence[MessageExt]) -> None: ...


# ---------------------------------------------------------------- the consumer, per service


class ConsumerContext(Protocol):
    """What every service reads of its consumer."""

    @property
    def group(self) -> str: ...

    @property
    def client_id(self) -> str: ...

    @property
    def config(self) -> PushConsumerConfig: ...

    @property
    def stats(self) -> Counters: ...

    @property
    def scheduler(self) -> Scheduler: ...

    def process_queues(self) -> list[ProcessQueue]: ...

    def broker_for(self, mq: MessageQueue) -> Any:
        """The master broker actor holding ``mq``."""
        ...

    def cached_broker_for(self, mq: MessageQueue) -> Any | None:
        """:meth:`broker_for` if it needs no call now (route and handle cached), else None."""
        ...

    def forget_route(self, topic: str, broker_name: str | None = None) -> None:
        """After a failed call: re-read the route, drop a broker's cached handle."""
        ...


class ConsumeContext(ConsumerContext, Protocol):
    """The consume services' consumer (concurrently and orderly)."""

    @property
    def listener(self) -> Listener | None: ...

    @property
    def pull(self) -> Pulls: ...

    @property
    def send_back(self) -> SendsBack: ...


class PullContext(ConsumerContext, Protocol):
    """The pull service's consumer."""

    @property
    def consume(self) -> Consumes: ...

    def subscription_of(self, topic: str) -> tuple[str, frozenset[str] | None]: ...


class SendBackContext(ConsumerContext, Protocol):
    """The send-back service's consumer."""

    @property
    def consume(self) -> Consumes: ...


class RebalanceContext(ConsumerContext, Protocol):
    """The rebalance services' consumer: its subscriptions, its queue table, its
    offsets, and the group membership it keeps up."""

    @property
    def topic(self) -> str: ...

    @property
    def ns(self) -> ClientView: ...

    @property
    def offset_store(self) -> OffsetStore: ...

    @property
    def pull(self) -> Pulls: ...

    def topics(self) -> list[str]: ...

    def heartbeat(self, wait: bool = False) -> None: ...

    def table_items(self) -> list[tuple[MessageQueue, ProcessQueue]]: ...

    def table_put(self, mq: MessageQueue, pq: ProcessQueue) -> None: ...

    def table_remove(self, mq: MessageQueue) -> None: ...

    def assigned_queues(self, topic: str | None = None) -> list[MessageQueue]: ...


class CoordinatedContext(RebalanceContext, Protocol):
    """The coordinated rebalance's consumer: also where to find the group's coordinator
    and the actor hosting the consumer (the coordinator watches it)."""

    @property
    def namespace(self) -> str: ...

    @property
    def actor_handle(self) -> Any: ...

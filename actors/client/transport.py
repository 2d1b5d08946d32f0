"""How one send call reaches a broker: the seam between the producer and the wire.

The producer's sender decides what to send where and what to do when it fails;
a :class:`Transport` only carries one call (``batches``, bound for their queues
already, to one broker) and hands back its pending answer. The one transport,
:class:`BrokerTransport`, makes the call on the broker's connection from the client
instance (``actors.client.instance``): with the default ``data_path="socket"`` the
broker's own socket (``actors.protocol.data_path``; through Ray while it opens or
when it cannot), with ``data_path="ray"`` its Ray actor handle; or, for a large call
to a broker on this node, its shared memory ring.

Contract of :meth:`Transport.call`:

* the answer is pending: an object ``actors.protocol.rpc.get(reply, timeout)``
  waits on and whose ``future()`` is a ``concurrent.futures.Future``, both giving
  the broker's :data:`~actors.protocol.wire.AckWire` (or raising what the broker
  raised);
* a broker the transport cannot reach raises ``BrokerUnavailableError`` at once
  (the sender marks the broker failed and retries elsewhere); any other error is
  the call's own;
* ``auto_n`` > 0 asks the broker to create the topic with that many queues;
* the reply is a plain :class:`~actors.protocol.rpc.PendingCall` only when the call
  keeps its place among the broker's calls made before it (the broker's socket);
  through Ray it is an ObjectRef or a :class:`RingCallThroughRay`
  (``actors.client.send_lanes`` sends nothing else to that broker meanwhile);
* the batches' bytes are copied (into the ring, into the call's argument) before
  :meth:`Transport.call` returns: an idempotent producer's chunk is bound in place
  (``EncodedBatch.with_sequence`` on a reserved slot), and bound again, rewriting those
  bytes, once the sender has given up on this call's binding, which may be before the
  call is answered (a refused retry, a new epoch). (A broker that answers that it
  cannot read the ring gets the call again through Ray: the bytes read back from the
  ring slot, which is held until then.)

:class:`BrokerTransport`: a call of ``OUT_OF_BAND_BYTES`` or more to a master on
this producer's own Ray node goes through a shared memory ring
(``actors.protocol.shared_ring``) the broker reads in place, instead of Ray's
object store; smaller calls, brokers on other nodes and any broker that cannot
read the ring get Ray's path. One ring per co-located master, made on first
use; a master a ring cannot serve (no memfd here, or the broker answered
``None``: it cannot open or check the ring) is remembered in ``ringless`` and
its calls go through Ray from then on, the one that found out sent again that
way. A ring slot is held from the write until the call has an answer or an
error. Rings are closed with the transport (or when it is collected), and the
brokers are told to let their mappings go.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayError

from actors.client.instance import ClientView
from actors.client.send_result import _arg
from actors.config.client import ProducerConfig
from actors.protocol import frames
from actors.protocol.route import TopicRouteData
from actors.protocol.rpc import PendingCall
from actors.protocol.shared_ring import SharedCall, SharedRing, pass_on
from actors.protocol.wire import OUT_OF_BAND_BYTES
from storage.codec import EncodedBatch
from storage.errors import BrokerUnavailableError

log = logging.getLogger("raymq.actors.producer")


class Reply(Protocol):
    """A call's pending answer (an ObjectRef, a :class:`SharedCall`): see the module doc."""

    def future(self) -> concurrent.futures.Future[Any]: ...


class Transport(Protocol):
    """How a send call reaches a broker; see the module doc for the contract."""

    def call(
        self,
        route: TopicRouteData,
        broker_name: str,
        batches: Sequence[EncodedBatch],
        auto_n: int,
    ) -> Reply: ...

    def close(self) -> None: ...


class RingCallThroughRay(PendingCall):
    """A ring call announced through Ray (its socket not open): Ray may start it before
    a call made earlier, so the send lanes make no other call to its broker meanwhile
    (``actors.client.send_lanes``)."""

    __slots__ = ()


class BrokerTransport:
    """Sends on the broker's connection (its socket, or its Ray actor handle with
    ``data_path="ray"``), or through a co-located broker's shared ring when large."""

    def __init__(self, ns: ClientView, config: ProducerConfig) -> None:
        self.ns = ns
        self.config = config
        self.rings: dict[str, SharedRing] = {}  # by co-located master's actor name
        self.ringless: set[str] = set()  # masters that cannot read a ring of ours
        self._rings_lock = threading.Lock()
        weakref.finalize(self, _close_rings, self.rings)

    def call(
        self,
        route: TopicRouteData,
        broker_name: str,
        batches: Sequence[EncodedBatch],
        auto_n: int,
    ) -> Any:
        """``broker.send`` of ``batches`` as one call: the handle's pending answer (a
        socket call's or an ObjectRef), or a :class:`SharedCall` when it went through
        the broker's shared ring. A broker that cannot be reached raises
        ``BrokerUnavailableError``."""
        try:
            broker = self.ns.broker(route, broker_name)
            parts = EncodedBatch.wire_parts(batches)
            size = frames.nbytes(parts)
            # a call this large would go through Ray's object store: the ring replaces that
            ring = self._ring_for(route, broker_name) if size >= OUT_OF_BAND_BYTES else None
            call = self._send_shared(broker, ring, parts, size, auto_n) if ring else None
            return call or broker.send.remote(_arg(b"".join(parts)), auto_n)
        except (BrokerUnavailableError, RayError) as exc:
            raise BrokerUnavailableError(f"broker {broker_name!r}: {exc}") from exc

    def close(self) -> None:
        """Close every ring; each broker lets the ring's memory go now rather than when
        idle (a broker that is gone took its mapping with it)."""
        for actor, ring in list(self.rings.items()):
            with contextlib.suppress(Exception):
                self.ns.broker_by_name(actor).drop_ring.remote(ring.ring_id)
        _close_rings(self.rings)

    # ------------------------------------------------------------ the shared ring
    def _ring_for(self, route: TopicRouteData, broker_name: str) -> SharedRing | None:
        """The shared ring of ``broker_name``'s master when it runs on this node."""
        if not self.config.shared_memory_send:
            return None
        bd = route.broker(broker_name)
        actor = bd.master_actor_name() if bd is not None else None
        if bd is None or actor is None or bd.node_ids.get(0) != self._node_id:
            return None
        with self._rings_lock:
            ring = self.rings.get(actor)
            if ring is None and actor not in self.ringless:
                try:
                    # a lane's calls in flight, and room for sync sends beside them
                    ring = self.rings[actor] = SharedRing(
                        self.config.max_in_flight_per_broker + 2, self._ring_slot_bytes
                    )
                except OSError as exc:  # no memfd here: Ray's object store it is
                    log.info("no shared ring for %s (%s): sending through Ray", actor, exc)
                    self.ringless.add(actor)
            return ring

    def _send_shared(
        self,
        broker: Any,
        ring: SharedRing,
        parts: list[Any],
        size: int,
        auto_n: int,
    ) -> SharedCall | None:
        """``broker.send_shared`` of a call's wire ``parts`` (``size`` bytes in all)
        written into a free slot of ``ring``, waited on as an ObjectRef is; ``None``
        when no slot is free."""
        offset = ring.write(parts, size)
        if offset is None:
            return None
        try:
            ref = broker.send_shared.remote(ring.ring_id, offset, size, auto_n)
        except BaseException:
            ring.release(offset)
            raise
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def answered(fut: concurrent.futures.Future[Any]) -> None:
            try:
                wire = fut.result()
            except BaseException as exc:  # noqa: BLE001 - the lane hears of it
                ring.release(offset)  # the call is over: the slot is free
                out.set_exception(exc)
                return
            if wire is not None:
                ring.release(offset)
                out.set_result(wire)
                return
            # this broker cannot read it: Ray's object store, with the bytes as this call
            # wrote them (a chunk bound in place may have been bound again since)
            blob = ring.read(offset, size)
            ring.release(offset)
            self._drop_ring(ring)
            try:
                again = broker.send.remote(
                    _arg(blob if blob is not None else b"".join(parts)), auto_n
                )
            except BaseException as exc:  # noqa: BLE001
                out.set_exception(exc)
                return
            again.future().add_done_callback(functools.partial(pass_on, out))

        ref.future().add_done_callback(answered)
        # announced on the socket, the call keeps its place among the broker's calls
        return SharedCall(out) if ref.__class__ is PendingCall else RingCallThroughRay(out)

    def _drop_ring(self, ring: SharedRing) -> None:
        with self._rings_lock:
            for actor, r in list(self.rings.items()):
                if r is ring:
                    del self.rings[actor]
                    self.ringless.add(actor)
                    log.info(
                        "broker %s cannot read this producer's ring: sending through Ray", actor
                    )
        ring.close()

    @functools.cached_property
    def _node_id(self) -> str:
        node_id: str = ray.get_runtime_context().get_node_id()
        return node_id

    @property
    def _ring_slot_bytes(self) -> int:
        # a lane's call at most: its records, plus the wire head's per-record arrays
        # and unique keys (< 64 B a record), plus its topics
        return 2 * self.config.max_batch_bytes + 64 * 4 * self.config.max_batch_messages + (1 << 16)


def _close_rings(rings: dict[str, SharedRing]) -> None:
    for ring in list(rings.values()):
        ring.close()
    rings.clear()

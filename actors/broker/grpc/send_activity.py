"""Producing over gRPC: ``SendMessage``, ``EndTransaction`` and ``RecallMessage``,
onto the broker's send and end-transaction processors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from actors.broker.grpc.activity import (
    ROUTE_TIMEOUT_S,
    TRANSACTION_GROUP_PREFIX,
    RecallRefused,
    unary,
)
from actors.broker.grpc.convert import (
    PROP_TIMER_DELIVER_MS,
    RecallHandle,
    StatusError,
    raymq_name,
    status,
    to_store_message,
)
from actors.broker.grpc.lite_activity import LiteActivity
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.config import broker_actor_name
from actors.protocol.topic import is_writeable
from actors.protocol.wire import SendAck
from storage.codec import encode_batch, java_hash
from storage.errors import BrokerUnavailableError, InvalidMessageError, TimerRecallError
from storage.message import Message, PutStatus
from storage.properties import PROP_UNIQ_KEY

log = logging.getLogger("raymq.actors.broker.grpc")

_PUT_CODES = {
    PutStatus.FLUSH_DISK_TIMEOUT: pb.Code.MASTER_PERSISTENCE_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: pb.Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: pb.Code.HA_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: pb.Code.INTERNAL_SERVER_ERROR,
}


def _born_host(context: Any) -> str:
    """The caller's ``ip:port`` (RocketMQ's born host) from gRPC's peer, IPv4 only."""
    peer = context.peer() or ""
    if peer.startswith("ipv4:"):
        return peer[5:]
    return "0.0.0.0:0"


class SendActivity(LiteActivity):
    """Sends, ends of transactions and recalls of timer messages (RocketMQ's proxy
    ``SendMessageActivity``, ``EndTransactionActivity`` and ``RecallMessageActivity``)."""

    # ------------------------------------------------------------ producing
    @unary(spb.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        if not request.messages:
            raise StatusError(pb.Code.BAD_REQUEST, "no messages")
        if any(m.system_properties.HasField("lite_topic") for m in request.messages):
            return await self.send_lite(request)
        rt = self.rt
        max_body = rt.store.config.max_message_size
        messages, transactional = [], []
        for m in request.messages:
            topic = raymq_name(m.topic)
            tc = rt.topics.get(topic)
            if tc is None:
                raise StatusError(
                    pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} is not on {rt.config.broker_name}"
                )
            if not is_writeable(tc.perm) or tc.write_queue_nums < 1:
                raise StatusError(pb.Code.FORBIDDEN, f"topic {topic!r} is not writable here")
            sp = m.system_properties
            if sp.HasField("message_group") and sp.message_group:
                qid = abs(java_hash(sp.message_group)) % tc.write_queue_nums  # one queue a group
            else:
                qid = next(self._round_robin) % tc.write_queue_nums
            is_txn = sp.message_type == pb.MessageType.TRANSACTION
            transactional.append(is_txn)
            messages.append(
                to_store_message(
                    m,
                    topic,
                    qid,
                    max_body,
                    transaction_group=TRANSACTION_GROUP_PREFIX + topic if is_txn else None,
                )
            )
        now_ms = int(time.time() * 1000)
        recall = [self._recall_handle(m, now_ms) for m in messages]
        host = _born_host(context)
        born = [
            (m.system_properties.born_timestamp.ToMilliseconds() or now_ms, host, 0)
            for m in request.messages
        ]
        try:
            batch = encode_batch(messages, max_message_size=max_body, born=born)
        except InvalidMessageError as exc:
            raise StatusError(pb.Code.BAD_REQUEST, str(exc)) from exc
        ack = SendAck.from_wire(await self.sender.send_batch(batch))
        code = _PUT_CODES.get(ack.status, pb.Code.OK)
        entries = []
        for i, m in enumerate(request.messages):
            entries.append(
                spb.SendResultEntry(
                    status=status(code, ack.status.value),
                    message_id=m.system_properties.message_id,
                    transaction_id=str(int(ack.commitlog_offsets[i])) if transactional[i] else "",
                    offset=int(ack.queue_offsets[i]),
                    recall_handle=recall[i] if code == pb.Code.OK else "",
                )
            )
        return spb.SendMessageResponse(status=status(code, ack.status.value), entries=entries)

    def _recall_handle(self, message: Message, now_ms: int) -> str:
        """A timer message's recall handle (its delivery time still ahead), else ""."""
        props = message.properties or {}
        deliver = props.get(PROP_TIMER_DELIVER_MS)
        if deliver is None or int(deliver) <= now_ms:
            return ""
        uniq = props[PROP_UNIQ_KEY]
        return RecallHandle(message.topic, self.rt.config.broker_name, int(deliver), uniq).encode()

    @unary(spb.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        topic = raymq_name(request.topic)
        try:
            half_offset = int(request.transaction_id)
            if half_offset < 0:
                raise ValueError(half_offset)
        except ValueError as exc:
            raise StatusError(
                pb.Code.INVALID_TRANSACTION_ID,
                f"transaction_id {request.transaction_id!r} is not one this broker gave",
            ) from exc
        if request.resolution == pb.TransactionResolution.COMMIT:
            commit = True
        elif request.resolution == pb.TransactionResolution.ROLLBACK:
            commit = False
        elif request.resolution == pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED:
            # a checker's UNKNOW (the clients send it as it is): nothing ends, the half
            # message stays pending and is checked again (RocketMQ's broker ignores it too)
            log.info("transaction %s of %s: still unknown", request.message_id, topic)
            return spb.EndTransactionResponse(status=status())
        else:
            raise StatusError(
                pb.Code.BAD_REQUEST, "resolution must be COMMIT, ROLLBACK or unspecified"
            )
        try:
            await self.transactions.end_transaction(
                TRANSACTION_GROUP_PREFIX + topic, half_offset, request.message_id, commit
            )
        except InvalidMessageError as exc:
            raise StatusError(pb.Code.INVALID_TRANSACTION_ID, str(exc)) from exc
        return spb.EndTransactionResponse(status=status())

    # ------------------------------------------------------------ recall
    @unary(spb.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: Any) -> Any:
        """Cancel a pending timer message by the recall handle its send answered, at the
        broker that holds it (the official clients send this to their access point, any
        broker). Refusals answer what RocketMQ's proxy does: ``INTERNAL_SERVER_ERROR``
        with its broker's reason (docs/rocketmq5.md, "Recall")."""
        topic = raymq_name(request.topic)
        try:
            handle = RecallHandle.decode(request.recall_handle)
        except StatusError as exc:  # the client's bad handle, not a fault here
            raise RecallRefused(exc.message) from exc
        if handle.topic != topic:
            raise RecallRefused(
                f"recall failed, topic not match: the handle is of {handle.topic!r}"
            )
        try:
            if handle.broker == self.rt.config.broker_name:
                await self.sender.recall_timer(topic, handle.message_id, handle.deliver_ms)
            else:
                await self._recall_at(handle)
        except TimerRecallError as exc:
            raise RecallRefused(f"recall failed, timestamp invalid: {exc}") from exc
        except BrokerUnavailableError as exc:
            raise RecallRefused(f"recall failed, broker service not available: {exc}") from exc
        return spb.RecallMessageResponse(status=status(), message_id=handle.message_id)

    async def _recall_at(self, handle: RecallHandle) -> None:
        """Forward a recall to the master of the handle's broker, over Ray."""
        name = broker_actor_name(handle.broker, 0)
        try:
            peer = await self.rt.run(ray.get_actor, name, self.rt.config.namespace)
        except ValueError as exc:  # no such actor: not a broker of this cluster
            raise BrokerUnavailableError(f"no broker {handle.broker!r} here") from exc
        try:
            await asyncio.wait_for(
                peer.recall_timer.remote(handle.topic, handle.message_id, handle.deliver_ms),
                ROUTE_TIMEOUT_S,
            )
        except ray.exceptions.RayTaskError as exc:  # the peer's refusal, as it is
            raise exc.as_instanceof_cause() from None
        except (ray.exceptions.RayActorError, asyncio.TimeoutError) as exc:
            raise BrokerUnavailableError(f"broker {handle.broker!r}: {exc}") from exc

    # ------------------------------------------------------------ not served (yet)

"""Consuming over gRPC: ``ReceiveMessage``, ``AckMessage``, ``ChangeInvisibleDuration``
and ``ForwardMessageToDeadLetterQueue``, onto the broker's POP processor.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from actors.broker.grpc.activity import (
    MAX_RECEIVE_BATCH,
    unary,
)
from actors.broker.grpc.convert import (
    StatusError,
    overall_status,
    raymq_name,
    status,
    status_of,
    to_pb_message,
)
from actors.broker.grpc.lite_activity import LiteActivity, parse_lite_handle
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.broker.processor.pop import PopProcessor
from actors.protocol.pop import MAX_INVISIBLE_MS, MIN_INVISIBLE_MS, PoppedMessage
from storage.message import MessageExt

R = TypeVar("R")


def _handle_status(exc: BaseException) -> tuple[int, str]:
    """A refused receipt handle is ``INVALID_RECEIPT_HANDLE``; a malformed one too."""
    code, message = status_of(exc)
    if code == pb.Code.BAD_REQUEST:
        return pb.Code.INVALID_RECEIPT_HANDLE, message
    return code, message


class ReceiveActivity(LiteActivity):
    """POP consumption (RocketMQ's proxy ``ReceiveMessageActivity``, ``AckMessageActivity``,
    ``ChangeInvisibleDurationActivity`` and ``ForwardMessageToDLQActivity``)."""

    # ------------------------------------------------------------ consuming (POP)
    def _popper(self) -> PopProcessor:
        if self.pop is None:
            raise StatusError(
                pb.Code.NOT_IMPLEMENTED,
                "this broker has no POP consumption (actors/broker/processor/pop.py)",
            )
        return self.pop

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """POP receive from this broker's queues of the topic (or, from a LITE parent, of
        the lite topics the client owns): the delivery time, the messages, then the
        status (``MESSAGE_NOT_FOUND`` when the long poll ends empty)."""
        lite: list[tuple[str, int, MessageExt]] = []
        found: list[PoppedMessage] = []
        try:
            self.authenticate(context)
            parent = raymq_name(request.message_queue.topic)
            if self.is_lite_parent(parent):
                # a LitePushConsumer asks with auto_renew and no invisible duration: its
                # lite topics are its own (their offsets say what is handed out), so
                # there is nothing to renew, only the push consumers' duration to show
                renewer = self.renewer if request.auto_renew else None
                invisible_ms = self._invisible_ms(request, renewer)
                wait_ms = self._wait_ms(request, context)
                lite = await self.receive_lite(request, context, parent, wait_ms)
            else:
                found, invisible_ms = await self._receive(request, context)
        except Exception as exc:  # noqa: BLE001 - every error is an answer
            code, message = status_of(exc)
            self.refused("ReceiveMessage", code, message, exc)
            yield spb.ReceiveMessageResponse(status=status(code, message))
            return
        topic = request.message_queue.topic
        if found or lite:  # when the broker handed them out (the clients time their delivery by it)
            delivered = spb.ReceiveMessageResponse()
            delivered.delivery_timestamp.GetCurrentTime()
            yield delivered
        for popped in found:
            yield spb.ReceiveMessageResponse(
                message=to_pb_message(
                    popped.message,
                    topic,
                    receipt_handle=popped.receipt_handle,
                    invisible_ms=invisible_ms,
                    delivery_attempt=popped.reconsume_times + 1,
                )
            )
        for lite_topic, offset, ext in lite:
            yield spb.ReceiveMessageResponse(
                message=self.lite_message(lite_topic, offset, ext, topic, invisible_ms)
            )
        if found or lite:
            yield spb.ReceiveMessageResponse(status=status())
        else:
            yield spb.ReceiveMessageResponse(
                status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message")
            )

    @staticmethod
    def _invisible_ms(request: Any, renewer: Any) -> int:
        if renewer is not None:  # a push consumer: invisible while it is alive and has not
            invisible_ms = int(renewer.invisible_ms)  # acked (renewed, actors.broker.grpc.renew)
        elif request.HasField("invisible_duration"):
            invisible_ms = request.invisible_duration.ToMilliseconds()
        else:
            raise StatusError(pb.Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required")
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise StatusError(
                pb.Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible_duration must be in {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms",
            )
        if not 1 <= request.batch_size <= MAX_RECEIVE_BATCH:
            raise StatusError(pb.Code.BAD_REQUEST, f"batch_size must be in 1..{MAX_RECEIVE_BATCH}")
        return invisible_ms

    @staticmethod
    def _wait_ms(request: Any, context: Any) -> int:
        """The long poll asked for, cut to answer before the client's deadline (long
        polling + its request timeout)."""
        wait_ms = 0
        if request.HasField("long_polling_timeout"):
            wait_ms = request.long_polling_timeout.ToMilliseconds()
            if wait_ms < 0:
                raise StatusError(pb.Code.ILLEGAL_POLLING_TIME, "long_polling_timeout < 0")
        remaining = context.time_remaining()
        if remaining is not None:
            wait_ms = max(0, min(wait_ms, int((remaining - 0.5) * 1000)))
        return int(wait_ms)

    async def _receive(self, request: Any, context: Any) -> tuple[list[PoppedMessage], int]:
        pop = self._popper()
        group = raymq_name(request.group, "group")
        topic = raymq_name(request.message_queue.topic)
        tag_expr = "*"
        if request.HasField("filter_expression"):
            fe = request.filter_expression
            if fe.type == pb.FilterType.SQL:
                raise StatusError(pb.Code.UNSUPPORTED, "SQL92 filters are not supported yet")
            tag_expr = fe.expression or "*"
        renewer = self.renewer if request.auto_renew else None
        invisible_ms = self._invisible_ms(request, renewer)
        wait_ms = self._wait_ms(request, context)
        client = self.client_id(context)
        started = time.monotonic()
        found = await pop.pop(
            group,
            topic,
            request.batch_size,
            invisible_ms,
            wait_ms,
            fifo=False,
            tag_expr=tag_expr,
            client_id=client,
        )
        if renewer is not None:
            renewer.track(group, topic, client, (p.receipt_handle for p in found), started)
        return list(found), invisible_ms

    async def _settle(
        self, group: str, topic: str, handle: str, op: Callable[[str], Awaitable[R]]
    ) -> R:
        """``op`` on the message's current handle: a push consumer's message renewed here
        has a newer one than the client holds (``actors.broker.grpc.renew``)."""
        if self.renewer is None:
            return await op(handle)
        return await self.renewer.settle(group, topic, handle, op)

    @unary(spb.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        """The entries acked as one store operation (``PopProcessor.ack_each``: one journal
        write), each answering its own status; a push consumer's message renewed here is
        acked under its current handle, on its own (``actors.broker.grpc.renew``). A
        LITE parent's messages commit their lite topics' offsets."""
        topic = raymq_name(request.topic)
        if not request.entries:
            raise StatusError(pb.Code.BAD_REQUEST, "no entries")
        if self.is_lite_parent(topic):
            return await self.ack_lite(request, context, topic)
        pop = self._popper()
        group = raymq_name(request.group, "group")
        if not request.entries:
            raise StatusError(pb.Code.BAD_REQUEST, "no entries")
        handles = [entry.receipt_handle for entry in request.entries]
        renewer = self.renewer
        held = [i for i, h in enumerate(handles) if renewer and renewer.holds(group, topic, h)]
        plain = sorted(set(range(len(handles))) - set(held))
        answers: list[BaseException | None] = [None] * len(handles)
        if plain:
            acked: list[BaseException | None]
            try:
                acked = list(await pop.ack_each(group, topic, [handles[i] for i in plain]))
            except Exception as exc:  # noqa: BLE001 - the whole operation refused
                acked = [exc] * len(plain)
            for i, answer in zip(plain, acked):
                answers[i] = answer
        for i in held:
            try:
                await self._settle(group, topic, handles[i], lambda h: pop.ack(group, topic, h))
            except Exception as exc:  # noqa: BLE001 - each entry answers on its own
                answers[i] = exc
        entries = []
        for entry, answer in zip(request.entries, answers):
            code: int = pb.Code.OK
            message = "OK"
            if answer is not None:
                code, message = _handle_status(answer)
                self.refused("AckMessage", code, message, answer)
            entries.append(
                spb.AckMessageResultEntry(
                    message_id=entry.message_id,
                    receipt_handle=entry.receipt_handle,
                    status=status(code, message),
                )
            )
        return spb.AckMessageResponse(status=overall_status(entries), entries=entries)

    @unary(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        """A message's new invisible time. A lite topic's messages stay with the client
        that owns it until acked (no invisible time): its handle answers as it is."""
        topic = raymq_name(request.topic)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise StatusError(
                pb.Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible_duration must be in {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms",
            )
        if self.is_lite_parent(topic):
            parse_lite_handle(request.receipt_handle)
            return spb.ChangeInvisibleDurationResponse(
                status=status(), receipt_handle=request.receipt_handle
            )
        pop = self._popper()
        group = raymq_name(request.group, "group")
        try:
            handle = await self._settle(
                group,
                topic,
                request.receipt_handle,
                lambda h: pop.change_invisible_duration(group, topic, h, invisible_ms),
            )
        except Exception as exc:  # noqa: BLE001
            code, message = _handle_status(exc)
            raise StatusError(code, message) from exc
        return spb.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle)

    @unary(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """A push consumer gave up on a message (its max delivery attempts): its copy goes
        to ``%DLQ%<group>`` and it is done."""
        pop = self._popper()
        group = raymq_name(request.group, "group")
        topic = raymq_name(request.topic)
        try:
            await self._settle(
                group,
                topic,
                request.receipt_handle,
                lambda h: pop.forward_to_dead_letter_queue(group, topic, h),
            )
        except Exception as exc:  # noqa: BLE001
            code, message = _handle_status(exc)
            raise StatusError(code, message) from exc
        return spb.ForwardMessageToDeadLetterQueueResponse(status=status())

"""Offsets over gRPC: ``QueryOffset``, ``GetOffset`` and ``UpdateOffset``, onto the
broker's consumer-management and admin processors; and ``PullMessage``, not served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from actors.broker.grpc.activity import (
    Activity,
    unary,
)
from actors.broker.grpc.convert import (
    StatusError,
    raymq_name,
    status,
    status_of,
)
from actors.broker.grpc.v2 import definition_pb2 as pb
from actors.broker.grpc.v2 import service_pb2 as spb
from actors.broker.processor.admin import AdminBrokerProcessor
from actors.broker.processor.consumer_manage import ConsumerManageProcessor


class OffsetActivity(Activity):
    """Consumer offsets by queue (``QueryOffset``, ``GetOffset``, ``UpdateOffset``), and the
    RPCs not served."""

    # ------------------------------------------------------------ offsets
    def _queue_here(self, mq: Any) -> tuple[str, int]:
        """The RayMQ topic and queue id of a request's queue, which must be this broker's
        (the one ``QueryRoute`` named for it)."""
        topic = raymq_name(mq.topic)
        name = self.rt.config.broker_name
        if mq.HasField("broker") and mq.broker.name and mq.broker.name != name:
            raise StatusError(
                pb.Code.BAD_REQUEST, f"queue of broker {mq.broker.name!r}: this is {name!r}"
            )
        tc = self.rt.topics.get(topic)
        if tc is None:
            raise StatusError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} is not on {name}")
        if not 0 <= mq.id < max(tc.read_queue_nums, tc.write_queue_nums):
            raise StatusError(pb.Code.BAD_REQUEST, f"topic {topic!r} has no queue {mq.id} here")
        return topic, int(mq.id)

    def _offsets(self) -> tuple[ConsumerManageProcessor, AdminBrokerProcessor]:
        if self.groups is None or self.admin is None:
            raise StatusError(pb.Code.NOT_IMPLEMENTED, "this endpoint has no offsets")
        return self.groups, self.admin

    @unary(spb.QueryOffsetResponse)
    async def QueryOffset(self, request: Any, context: Any) -> Any:
        """A queue's first offset (``BEGINNING``), its next (``END``), or the first stored
        at or after a time (``TIMESTAMP``)."""
        _, admin = self._offsets()
        topic, qid = self._queue_here(request.message_queue)
        policy = request.query_offset_policy
        if policy == pb.QueryOffsetPolicy.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise StatusError(pb.Code.BAD_REQUEST, "TIMESTAMP needs a timestamp")
            ms = request.timestamp.ToMilliseconds()
            if ms < 0:
                raise StatusError(pb.Code.BAD_REQUEST, f"timestamp {ms} ms is before 1970")
            offset = await admin.offset_by_time(topic, qid, ms)
        elif policy in (pb.QueryOffsetPolicy.BEGINNING, pb.QueryOffsetPolicy.END):
            low, high = await admin.min_max_offset(topic, qid)
            offset = low if policy == pb.QueryOffsetPolicy.BEGINNING else high
        else:
            raise StatusError(pb.Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")
        return spb.QueryOffsetResponse(status=status(), offset=offset)

    @unary(spb.GetOffsetResponse)
    async def GetOffset(self, request: Any, context: Any) -> Any:
        """The group's committed offset of the queue (the next message it consumes)."""
        groups, _ = self._offsets()
        group = raymq_name(request.group, "group")
        topic, qid = self._queue_here(request.message_queue)
        offset = await groups.query_offset(group, topic, qid)
        if offset < 0:
            raise StatusError(
                pb.Code.OFFSET_NOT_FOUND, f"{group} has no offset of {topic}:{qid} here"
            )
        return spb.GetOffsetResponse(status=status(), offset=offset)

    @unary(spb.UpdateOffsetResponse)
    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        """Commit the group's offset of the queue (0 .. the queue's next offset), as a
        native consumer's commit: replicated to slaves, read by lag and the console."""
        groups, _ = self._offsets()
        group = raymq_name(request.group, "group")
        topic, qid = self._queue_here(request.message_queue)
        await groups.commit_offsets(
            group, {(topic, qid): int(request.offset)}, self.client_id(context)
        )
        return spb.UpdateOffsetResponse(status=status())

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Not served yet: one status (no client of the official ones calls it)."""
        try:
            self.authenticate(context)
            raise StatusError(pb.Code.NOT_IMPLEMENTED, "PullMessage is not supported yet")
        except Exception as exc:  # noqa: BLE001 - every error is an answer
            code, message = status_of(exc)
            self.refused("PullMessage", code, message, exc)
            yield spb.PullMessageResponse(status=status(code, message))

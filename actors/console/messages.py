"""The console's message pages (find by id or key, a message and who consumed it, resend
to a group), the dead letters and the pending transactions."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from actors.console import pages
from actors.console.core import CSRF, View
from actors.console.forms import Refused, group_name, message_id, topic_name, utc_ms
from actors.console.jobs import Progress
from actors.protocol.checks import MAX_KEY_LEN, check_str
from actors.protocol.topic import dlq_topic
from storage import codec
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.console")

DLQ_LIST_MAX = 1000


class Messages(View):
    # ------------------------------------------------------------ messages
    async def messages(self, request: web.Request) -> web.Response:
        q = request.query
        form = {"topic": q.get("topic", ""), "key": q.get("key", ""), "id": q.get("id", "")}
        found = None
        error = None
        try:
            if form["id"]:
                form["id_topic"], form["topic"] = form["topic"], ""
                msg_id = message_id(form["id"])
                topic = topic_name(form["id_topic"]) if form["id_topic"] else None
                found = [await self.call(self.admin.query_by_id, msg_id, topic)]
            elif form["topic"] or form["key"]:
                topic = topic_name(form["topic"])
                key = form["key"]
                if not key:
                    raise Refused("give a key to find by key")
                check_str("key", key, MAX_KEY_LEN)
                form["begin"], form["end"] = q.get("begin", ""), q.get("end", "")
                begin = utc_ms(form["begin"], "from") if form["begin"] else None
                end = utc_ms(form["end"], "to") if form["end"] else None
                if begin is not None and end is not None and end < begin:
                    raise Refused("the time range ends before it begins")
                found = await self.call(self.admin.query_by_key, topic, key, 64, begin, end)
        except (Refused, RayMQError, ValueError) as exc:
            error = str(exc)
        body = pages.messages_page(form, found)
        return self.render(
            request,
            "Messages",
            body,
            active="messages",
            error=error,
            status=422 if error else 200,
        )

    async def message(self, request: web.Request) -> web.Response:
        msg_id = message_id(request.query.get("id", ""))
        topic_text = request.query.get("topic", "")
        topic = topic_name(topic_text) if topic_text else None
        try:
            m = await self.call(self.admin.query_by_id, msg_id, topic)
        except RayMQError as exc:
            raise Refused(str(exc), 404) from None
        consumed = await self.call(self._consumed_by, m)
        body = pages.message_page(m, consumed, request[CSRF])
        return self.render(request, f"Message {m.msg_id}", body, active="messages")

    def _broker_of(self, m: Any) -> str | None:
        """The broker name of the broker that stores ``m`` (by its store host)."""
        host, _ = codec.parse_offset_msg_id(m.offset_msg_id)
        info = self.admin.ns.call("get_cluster_info")
        for name, entry in info["brokers"].items():
            for member in entry["members"].values():
                if member["addr"] == host:
                    return str(name)
        return None

    def _consumed_by(self, m: Any) -> list[dict[str, Any]]:
        """Each group with offsets on ``m``'s topic at its broker: its committed offset of
        ``m``'s queue and whether that is past ``m`` (the group consumed it)."""
        broker = self._broker_of(m)
        counters = self.admin.counters().get(broker or "", {})
        groups = sorted(g for g, topics in counters.get("groups", {}).items() if m.topic in topics)
        out = []
        for group in groups:
            committed = None
            for row in self.admin.consumer_lag(group, m.topic):
                if row["broker"] == broker and row["queue_id"] == m.queue_id:
                    committed = row["consumer_offset"]
            consumed = committed is not None and committed > m.queue_offset
            out.append({"group": group, "committed": committed, "consumed": consumed})
        return out

    async def resend_to_group(self, request: web.Request) -> web.Response:
        form = await request.post()
        msg_id = message_id(str(form.get("id", "")))
        topic_text = str(form.get("topic", ""))
        topic = topic_name(topic_text) if topic_text else None
        group = group_name(str(form.get("group", "")).strip())
        back = pages.url("/message", id=msg_id, topic=topic)
        result = await self.call(self.admin.resend_to_group, msg_id, group, topic)
        mq = result.message_queue
        log.info("console: resent %s to group %s (%s)", msg_id, group, mq.topic)
        return self.redirect(
            back, f"resent {result.msg_id} to group {group}: {mq.topic} on {mq.broker_name}"
        )

    # ------------------------------------------------------------ dead letters
    async def dlq(self, request: web.Request) -> web.Response:
        text = request.query.get("group", "").strip()
        if not text:
            return self.render(request, "Dead letters", pages.dlq_page("", None, ""), active="dlq")
        group = group_name(text)
        topics = await self.call(self._all_topics)
        if dlq_topic(group) not in topics:
            raise Refused(
                f"group {group!r} has no dead-letter queue ({dlq_topic(group)} does not "
                "exist): none of its messages was dead-lettered",
                404,
            )
        letters = await self.call(self.admin.dlq_messages, group, DLQ_LIST_MAX)
        body = pages.dlq_page(group, letters, request[CSRF])
        return self.render(request, f"Dead letters of {group}", body, active="dlq")

    async def resend(self, request: web.Request) -> web.Response:
        form = await request.post()
        group = group_name(str(form.get("group", "")).strip())
        msg_id = str(form.get("msg_id", "")).strip()
        ids = [message_id(msg_id)] if msg_id else None
        topics = await self.call(self._all_topics)
        if dlq_topic(group) not in topics:
            raise Refused(f"group {group!r} has no dead-letter queue: nothing was resent", 404)
        if ids is None:  # all of them: a job with progress
            chunk = self.config.job_chunk

            def work(progress: Progress) -> str:
                results = self.admin.resend_dlq(group, None, progress=progress, chunk=chunk)
                sent = sorted({r.message_queue.topic for r in results})
                return f"resent {len(results)} dead letter(s) of {group} to {', '.join(sent)}"

            job = self.jobs.start(
                self.jobs_pool,
                "dead-letter resend",
                f"every dead letter of {group}",
                pages.url("/dlq", group=group),
                work,
            )
            return self.redirect(f"/jobs/{job.id}")
        results = await self.call(self.admin.resend_dlq, group, ids)
        if not results:
            raise Refused(f"no dead letter of {group!r} has id {msg_id!r}: nothing was resent", 404)
        topics_sent = sorted({r.message_queue.topic for r in results})
        log.info("console: resent %d dead letter(s) of %s", len(results), group)
        return self.redirect(
            pages.url("/dlq", group=group),
            f"resent {len(results)} dead letter(s) of {group} to {', '.join(topics_sent)}",
        )

    # ------------------------------------------------------------ transactions
    async def transactions(self, request: web.Request) -> web.Response:
        text = request.query.get("group", "").strip()
        group = group_name(text) if text else ""
        pending = await self.call(self.admin.pending_transactions, group or None)
        try:
            coordinator = await self.call(self.admin.transaction_coordinator)
        except Exception as exc:  # noqa: BLE001 - restarting: the half messages still show
            log.info("console: the transaction coordinator did not answer: %s", exc)
            coordinator = {"unanswered": type(exc).__name__}
        title = f"Transactions of {group}" if group else "Transactions"
        body = pages.transactions_page(pending, group, coordinator)
        return self.render(request, title, body, active="transactions")

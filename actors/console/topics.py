"""The console's cluster and topic pages: list, create, update, delete, and send a test
message."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from actors.console import pages
from actors.console.core import CSRF, View
from actors.console.forms import MAX_QUEUES, Refused, int_field, perm_field, topic_name
from actors.console.lite import LiteTopics, quota_ttl
from actors.protocol.checks import MAX_KEY_LEN, check_str
from actors.protocol.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    is_system_topic,
    perm_to_string,
)
from storage import Message
from storage.errors import RayMQError, TopicNotFoundError

log = logging.getLogger("raymq.actors.console")


class Topics(View):
    # ------------------------------------------------------------ cluster
    async def cluster(self, request: web.Request) -> web.Response:
        status = await self.call(self.admin.cluster_status)
        body = pages.cluster_page(status, self.sampler.broker_rates())
        return self.render(request, "Cluster", body, active="cluster")

    # ------------------------------------------------------------ topics
    def _topic_rows(self, show_system: bool) -> list[dict[str, Any]]:
        rows = []
        held: dict[str, int] = {}
        for counters in self.admin.counters().values():
            for topic, (_, n) in counters["topics"].items():
                held[topic] = held.get(topic, 0) + n
        tps = self.sampler.topic_rates()
        lite = set(self.admin.lite_parents())
        for name in sorted(self.admin.list_topics(include_system=show_system)):
            if not show_system and name.startswith(
                (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
            ):
                continue
            try:
                route = self.admin.topic_route(name)
            except TopicNotFoundError:
                continue  # deleted meanwhile
            qds = route.queue_datas
            rows.append(
                {
                    "name": name,
                    "read": sum(q.read_queue_nums for q in qds),
                    "write": sum(q.write_queue_nums for q in qds),
                    "perm": " ".join(sorted({perm_to_string(q.perm) for q in qds})),
                    "brokers": sorted(q.broker_name for q in qds),
                    "messages": held.get(name),
                    "tps": tps.get(name),
                    "type": "LITE" if name in lite else "",
                }
            )
        return rows

    async def topics(
        self,
        request: web.Request,
        *,
        error: str | None = None,
        form: dict[str, str] | None = None,
    ) -> web.Response:
        show_system = request.query.get("system") == "1"
        rows = await self.call(self._topic_rows, show_system)
        body = pages.topics_page(rows, request[CSRF], show_system, form or {})
        return self.render(
            request, "Topics", body, active="topics", error=error, status=422 if error else 200
        )

    async def create_topic(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items() if k != "csrf"}
        try:
            name = topic_name(form.get("name", ""))
            if is_system_topic(name) or name.startswith(
                (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
            ):
                raise Refused(f"topic {name!r} is a system name: the brokers make such topics")
            kind = form.get("type", "NORMAL")
            if kind not in ("NORMAL", "LITE"):
                raise Refused(f"type={kind!r}: NORMAL or LITE")
            read = int_field(form, "read_queues", 1, MAX_QUEUES)
            write = int_field(form, "write_queues", 1, MAX_QUEUES)
            perm = perm_field(form)
            quota, ttl_ms = quota_ttl(form)
            existing = await self.call(self._all_topics)
            if name in existing:
                raise Refused(f"topic {name!r} exists already: nothing was changed")
            if kind == "LITE":
                made = await self.call(
                    lambda: self.admin.create_lite_topic(name, quota=quota, ttl_ms=ttl_ms)
                )
            else:
                await self.call(self.admin.create_topic, name, read, write, perm)
        except (Refused, RayMQError, ValueError) as exc:
            return await self.topics(request, error=str(exc), form=form)
        if kind == "LITE":
            first = next(iter(made.values()))
            log.info("console: created LITE topic %s (%s)", name, first)
            return self.redirect(
                f"/topics/{pages.seg(name)}",
                f"created LITE topic {name}: quota {first['quota']} lite topics per broker, "
                f"TTL {first['ttl_ms']} ms",
            )
        log.info("console: created topic %s (%d/%d queues, perm %d)", name, read, write, perm)
        return self.redirect(
            f"/topics/{pages.seg(name)}",
            f"created topic {name}: {read} read / {write} write queues",
        )

    def _topic_detail(self, topic: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        route = self.admin.topic_route(topic)
        brokers = [
            {
                "broker": q.broker_name,
                "read": q.read_queue_nums,
                "write": q.write_queue_nums,
                "perm": q.perm,
            }
            for q in sorted(route.queue_datas, key=lambda q: q.broker_name)
        ]
        return brokers, self.admin.topic_status(topic)

    async def topic(
        self,
        request: web.Request,
        *,
        error: str | None = None,
        form: dict[str, str] | None = None,
    ) -> web.Response:
        topic = topic_name(request.match_info["topic"])
        try:
            route, queues = await self.call(self._topic_detail, topic)
        except TopicNotFoundError:
            raise Refused(f"topic {topic!r} does not exist", 404) from None
        body = pages.topic_page(
            topic, route, queues, request[CSRF], self.config.max_body_bytes, form or {}
        )
        body = await LiteTopics(self.console).section(request, topic) + body
        return self.render(
            request,
            f"Topic {topic}",
            body,
            active="topics",
            error=error,
            status=422 if error else 200,
        )

    async def send(self, request: web.Request) -> web.Response:
        topic = topic_name(request.match_info["topic"])
        post = await request.post()
        form = {k: str(v) for k, v in post.items() if k != "csrf"}
        try:
            body = form.get("body", "").encode("utf-8")
            if len(body) > self.config.max_body_bytes:
                raise Refused(
                    f"the body is {len(body):,} bytes: the console sends at most "
                    f"{self.config.max_body_bytes:,} (max message size); nothing was sent"
                )
            if not body:
                raise Refused("the body is empty: nothing was sent")
            tags = form.get("tags", "").strip() or None
            if tags is not None:
                check_str("tags", tags, 255)
            keys = [k.strip() for k in form.get("keys", "").split(",") if k.strip()]
            for k in keys:
                check_str("key", k, MAX_KEY_LEN)
            message = Message(topic, body, tags=tags, keys=keys)
            result = await self.call(lambda: self.producer().send(message))
        except (Refused, RayMQError, ValueError) as exc:
            form["body"] = form.get("body", "")[:4096]  # never echo a huge body back
            return await self.topic(request, error=str(exc), form=form)
        mq = result.message_queue
        log.info("console: sent a test message to %s (%s)", topic, result.msg_id)
        return self.redirect(
            f"/topics/{pages.seg(topic)}",
            f"sent message {result.msg_id} to {mq.broker_name} queue {mq.queue_id} "
            f"offset {result.queue_offset}",
        )

    async def update_topic(self, request: web.Request) -> web.Response:
        topic = topic_name(request.match_info["topic"])
        form = {k: str(v) for k, v in (await request.post()).items() if k != "csrf"}
        try:
            read = int_field(form, "read_queues", 1, MAX_QUEUES)
            write = int_field(form, "write_queues", 1, MAX_QUEUES)
            perm = perm_field(form)
            await self.call(
                lambda: self.admin.update_topic(
                    topic, read_queue_nums=read, write_queue_nums=write, perm=perm
                )
            )
        except (Refused, RayMQError, ValueError) as exc:
            return await self.topic(request, error=str(exc))
        log.info("console: updated topic %s (%d/%d queues, perm %d)", topic, read, write, perm)
        return self.redirect(
            f"/topics/{pages.seg(topic)}",
            f"updated topic {topic}: {read} read / {write} write queues, perm {perm}",
        )

    async def delete_topic(self, request: web.Request) -> web.Response:
        topic = topic_name(request.match_info["topic"])
        deleted = await self.call(self.admin.delete_topic, topic)
        if not deleted:
            raise Refused(f"topic {topic!r} does not exist: nothing was deleted", 404)
        log.info("console: deleted topic %s on %s", topic, deleted)
        return self.redirect("/topics", f"deleted topic {topic} on {', '.join(deleted)}")

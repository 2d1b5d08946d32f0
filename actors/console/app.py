"""The console's web application (aiohttp): its routes, the access rules every request
passes, and the handlers, which ask the admin client (``actors.client.admin``, the
calls ``raymq`` makes) and render ``pages``.

Access: with ``ConsoleConfig.auth`` every page but the login page needs the session
cookie the login gives (or ``Authorization: Bearer <token>``). Every state-changing
action is a POST carrying the page's CSRF token, which must equal the token in the
browser's ``raymq_csrf`` cookie (SameSite=Strict) and come from this console's own
origin. Input is checked before any call: a refused form changes nothing and says why
on the page.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from aiohttp import web

from actors.client.admin import Admin, epoch_ms
from actors.client.producer import Producer
from actors.config.console import ConsoleConfig
from actors.console import assets, pages
from actors.console.jobs import Job, Jobs, Progress
from actors.console.sampler import Sampler
from actors.namesrv.client import named_actors
from actors.protocol.checks import MAX_KEY_LEN, check_str, validate_group
from actors.protocol.names import coordinator_actor_name
from actors.protocol.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    dlq_topic,
    is_system_topic,
    perm_to_string,
)
from storage import Message, codec
from storage.codec import validate_topic
from storage.errors import RayMQError, TopicNotFoundError

log = logging.getLogger("raymq.actors.console")

CSRF_COOKIE = "raymq_csrf"
SESSION_COOKIE = "raymq_session"
FLASH_COOKIE = "raymq_flash"
PRODUCER_GROUP = "raymq-console"
MAX_REQUEST_BYTES = 16 << 20
"""A request body aiohttp reads at all; the console's own limits (a message body) are
smaller and refused with a message."""
MAX_QUEUES = 1024
DLQ_LIST_MAX = 1000
MAX_ID_LEN = 128
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CSRF = web.RequestKey("csrf", str)
"""This request's CSRF token (the browser's cookie, or a new one the response sets)."""
FLASH = web.RequestKey("flash", str)
"""What the last action did, told once on the page after its redirect."""


class Refused(Exception):
    """Input the console will not act on; the page says why and nothing changes."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class Console:
    """The handlers of one console, over one admin client."""

    def __init__(self, config: ConsoleConfig, admin: Admin) -> None:
        self.config = config
        self.admin = admin
        self.session = secrets.token_urlsafe(32)  # the cookie a login gives, this run only
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="raymq-console")
        self.jobs_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="raymq-console-job")
        self._producer: Producer | None = None
        self.sampler = Sampler(
            config.sample_interval_ms / 1000, config.samples_kept, config.rate_window_ms / 1000
        )
        self.jobs = Jobs()

    # ------------------------------------------------------------ plumbing
    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking admin call, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _all_topics(self) -> list[str]:
        return self.admin.list_topics(include_system=True)

    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                PRODUCER_GROUP,
                namespace=self.config.namespace,
                nameservers=self.admin.ns.nameservers,
            )
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        self.pool.shutdown(wait=False)
        self.jobs_pool.shutdown(wait=False)

    async def start_sampling(self) -> None:
        self.sampler.start(lambda: self.call(self.admin.counters))

    def render(
        self,
        request: web.Request,
        title: str,
        body: str,
        *,
        active: str,
        error: str | None = None,
        status: int = 200,
    ) -> web.Response:
        notice = request.get(FLASH)
        html = pages.layout(
            title,
            body,
            active=active,
            namespace=self.config.namespace,
            notice=notice,
            error=error,
        )
        response = web.Response(text=html, content_type="text/html", status=status)
        if notice:
            response.del_cookie(FLASH_COOKIE, path="/")
        return response

    @staticmethod
    def redirect(location: str, notice: str | None = None) -> web.Response:
        response = web.Response(status=303, headers={"Location": location})
        if notice:
            response.set_cookie(
                FLASH_COOKIE, quote(notice[:500]), path="/", httponly=True, samesite="Strict"
            )
        return response

    # ------------------------------------------------------------ middlewares
    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Security headers, the CSRF cookie, the login, and the same-origin POST rule."""
        token = request.cookies.get(CSRF_COOKIE, "")
        fresh = len(token) < 32
        request[CSRF] = secrets.token_urlsafe(32) if fresh else token
        flash = request.cookies.get(FLASH_COOKIE)
        if flash:
            request[FLASH] = unquote(flash)
        response = await self._guarded(request, handler)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE, request[CSRF], path="/", httponly=True, samesite="Strict"
            )
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"
        if not request.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        public = request.path.startswith("/static/") or request.path in ("/login", "/healthz")
        if self.config.auth and not public and not self._signed_in(request):
            if request.method == "GET":
                return self.redirect("/login?next=" + quote(request.path_qs, safe=""))
            return self.refusal(request, "sign in first", 401)
        if request.method == "POST":
            why = await self._post_refused(request)
            if why:
                log.warning("console: refused POST %s: %s", request.path, why)
                return self.refusal(request, why, 403)
        try:
            return await handler(request)
        except Refused as exc:
            return self.refusal(request, str(exc), exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return self.refusal(request, f"{exc.status} {exc.reason}: {request.path}", exc.status)
        except RayMQError as exc:  # the cluster refused it (or cannot answer): say so
            log.info("console: %s %s: %s", request.method, request.path, exc)
            return self.refusal(request, f"{type(exc).__name__}: {exc}", 422)
        except Exception as exc:  # noqa: BLE001 - a page says what failed; the log has the rest
            log.exception("console: %s %s failed", request.method, request.path)
            return self.refusal(request, f"{type(exc).__name__}: {exc}", 500)

    def _signed_in(self, request: web.Request) -> bool:
        assert self.config.auth is not None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self.session):
            return True
        bearer = request.headers.get("Authorization", "")
        return bearer.startswith("Bearer ") and hmac.compare_digest(
            bearer[7:].encode(), self.config.auth.encode()
        )

    async def _post_refused(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        if origin is not None and origin != "null":
            parts = urlsplit(origin)
            if parts.netloc != request.host:
                return f"the form came from another site ({origin}): nothing was changed"
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            return (
                f"the request is over {pages.size(MAX_REQUEST_BYTES)}, more than the "
                "console reads: nothing was changed"
            )
        sent = form.get("csrf")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not isinstance(sent, str) or not cookie or not hmac.compare_digest(sent, cookie):
            return (
                "the form's security token is missing or stale (reload the page and try "
                "again): nothing was changed"
            )
        return None

    def refusal(self, request: web.Request, message: str, status: int) -> web.Response:
        return self.render(
            request,
            "Refused" if status < 500 else "Error",
            '<p><a href="/">back to the cluster</a></p>',
            active="",
            error=message,
            status=status,
        )

    # ------------------------------------------------------------ static
    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        files = {
            "console.css": (assets.CSS, "text/css"),
            "console.js": (assets.JS, "application/javascript"),
            "favicon.svg": (assets.FAVICON_SVG, "image/svg+xml"),
        }
        if name not in files:
            raise web.HTTPNotFound()
        text, kind = files[name]
        return web.Response(text=text, content_type=kind, headers={"Cache-Control": "max-age=3600"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # ------------------------------------------------------------ access
    async def login_form(self, request: web.Request) -> web.Response:
        nxt = request.query.get("next", "/")
        return self.render(request, "Sign in", pages.login_page(request[CSRF], nxt), active="")

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        token = form.get("token")
        if not self.config.auth:
            return self.redirect("/")
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode(), self.config.auth.encode()
        ):
            log.warning("console: a sign-in with a wrong token from %s", request.remote)
            return self.render(
                request,
                "Sign in",
                pages.login_page(request[CSRF], request.query.get("next", "/")),
                active="",
                error="wrong token",
                status=401,
            )
        nxt = request.query.get("next", "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"
        response = self.redirect(nxt)
        response.set_cookie(
            SESSION_COOKIE, self.session, path="/", httponly=True, samesite="Strict"
        )
        return response

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
            name = _topic_name(form.get("name", ""))
            if is_system_topic(name) or name.startswith(
                (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
            ):
                raise Refused(f"topic {name!r} is a system name: the brokers make such topics")
            read = _int_field(form, "read_queues", 1, MAX_QUEUES)
            write = _int_field(form, "write_queues", 1, MAX_QUEUES)
            perm = _perm_field(form)
            existing = await self.call(self._all_topics)
            if name in existing:
                raise Refused(f"topic {name!r} exists already: nothing was changed")
            await self.call(self.admin.create_topic, name, read, write, perm)
        except (Refused, RayMQError, ValueError) as exc:
            return await self.topics(request, error=str(exc), form=form)
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
        topic = _topic_name(request.match_info["topic"])
        try:
            route, queues = await self.call(self._topic_detail, topic)
        except TopicNotFoundError:
            raise Refused(f"topic {topic!r} does not exist", 404) from None
        body = pages.topic_page(
            topic, route, queues, request[CSRF], self.config.max_body_bytes, form or {}
        )
        return self.render(
            request,
            f"Topic {topic}",
            body,
            active="topics",
            error=error,
            status=422 if error else 200,
        )

    async def send(self, request: web.Request) -> web.Response:
        topic = _topic_name(request.match_info["topic"])
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
        topic = _topic_name(request.match_info["topic"])
        form = {k: str(v) for k, v in (await request.post()).items() if k != "csrf"}
        try:
            read = _int_field(form, "read_queues", 1, MAX_QUEUES)
            write = _int_field(form, "write_queues", 1, MAX_QUEUES)
            perm = _perm_field(form)
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
        topic = _topic_name(request.match_info["topic"])
        deleted = await self.call(self.admin.delete_topic, topic)
        if not deleted:
            raise Refused(f"topic {topic!r} does not exist: nothing was deleted", 404)
        log.info("console: deleted topic %s on %s", topic, deleted)
        return self.redirect("/topics", f"deleted topic {topic} on {', '.join(deleted)}")

    # ------------------------------------------------------------ groups
    def _known_groups(self) -> list[dict[str, Any]]:
        seen: dict[str, set[str]] = {}
        prefix = coordinator_actor_name("")
        for name in named_actors(self.config.namespace):
            if name.startswith(prefix):
                seen.setdefault(name[len(prefix) :], set()).add("coordinator")
        for topic in self._all_topics():
            for p, what in ((RETRY_GROUP_TOPIC_PREFIX, "retries"), (DLQ_GROUP_TOPIC_PREFIX, "DLQ")):
                if topic.startswith(p):
                    seen.setdefault(topic[len(p) :], set()).add(what)
        return [{"name": g, "seen_as": sorted(s)} for g, s in sorted(seen.items())]

    async def groups(self, request: web.Request) -> web.Response:
        if "group" in request.query:  # the find form
            group = _group_name(request.query["group"].strip())
            return self.redirect(f"/groups/{pages.seg(group)}")
        rows = await self.call(self._known_groups)
        return self.render(request, "Consumer groups", pages.groups_page(rows), active="groups")

    def _group_detail(self, group: str) -> tuple[list[Any], list[str], Any, bool, Any]:
        lag = self.admin.consumer_lag(group)
        members = self.admin.consumer_list(group)
        status = None
        if self.admin._coordinator(group) is not None:
            try:
                status = self.admin.group_status(group)
            except RayMQError:
                status = None
        has_dlq = dlq_topic(group) in self._all_topics()
        return lag, members, status, has_dlq, self.admin.fleet_status(group)

    async def group(self, request: web.Request) -> web.Response:
        group = _group_name(request.match_info["group"])
        lag, members, status, has_dlq, fleet = await self.call(self._group_detail, group)
        if not lag and not members and status is None and not has_dlq and fleet is None:
            raise Refused(
                f"group {group!r} is unknown: no broker holds offsets of it, no consumer of "
                "it is online, and it has no coordinator and no dead letters",
                404,
            )
        lag_series = {
            name: pts for name, pts in self.sampler.series()["lag"].items() if name == group
        }
        body = pages.group_page(
            group,
            lag,
            members,
            status,
            self.config.refresh_ms,
            request[CSRF],
            consume_tps=self.sampler.group_rates().get(group),
            fleet=fleet,
            lag_series=lag_series,
        )
        return self.render(request, f"Group {group}", body, active="groups")

    async def reset(self, request: web.Request) -> web.Response:
        group = _group_name(request.match_info["group"])
        form = await request.post()
        topic = _topic_name(str(form.get("topic", "")))
        where = str(form.get("to", "")).strip()
        time_text = str(form.get("time", ""))
        to: int | str
        if where in ("earliest", "latest"):
            to = where
        elif where == "time":
            to = _utc_ms(time_text, "time")
        else:
            raise Refused(f"reset to {where!r}: earliest, latest or a time")
        lag = await self.call(self.admin.consumer_lag, group, topic)
        if not lag:
            raise Refused(f"group {group!r} has no offsets on {topic!r}: nothing was reset", 404)
        label = where if where != "time" else time_text

        def work(progress: Progress) -> str:
            done = self.admin.reset_offset(group, topic, to, progress)
            return f"reset {group} on {topic} to {label} ({len(done)} queues)"

        job = self.jobs.start(
            self.jobs_pool,
            "offset reset",
            f"{group} on {topic} to {label}",
            f"/groups/{pages.seg(group)}",
            work,
        )
        return self.redirect(f"/jobs/{job.id}")

    # ------------------------------------------------------------ long operations
    def _job(self, request: web.Request) -> Job:
        job = self.jobs.get(request.match_info["job"])
        if job is None:
            raise Refused("no such job (the console keeps its last 100)", 404)
        return job

    async def job(self, request: web.Request) -> web.Response:
        job = self._job(request)
        return self.render(request, f"Job {job.id}", pages.job_page(job.view()), active="")

    async def job_progress(self, request: web.Request) -> web.Response:
        return web.json_response(self._job(request).view())

    # ------------------------------------------------------------ metrics
    async def metrics_charts(self, request: web.Request) -> web.Response:
        s = self.sampler
        body = pages.metrics_page(
            s.series(),
            len(s.samples),
            s.interval_s,
            max(self.config.refresh_ms, 1000),
            s.last_error,
        )
        return self.render(request, "Metrics", body, active="metrics")

    # ------------------------------------------------------------ messages
    async def messages(self, request: web.Request) -> web.Response:
        q = request.query
        form = {"topic": q.get("topic", ""), "key": q.get("key", ""), "id": q.get("id", "")}
        found = None
        error = None
        try:
            if form["id"]:
                form["id_topic"], form["topic"] = form["topic"], ""
                msg_id = _msg_id(form["id"])
                topic = _topic_name(form["id_topic"]) if form["id_topic"] else None
                found = [await self.call(self.admin.query_by_id, msg_id, topic)]
            elif form["topic"] or form["key"]:
                topic = _topic_name(form["topic"])
                key = form["key"]
                if not key:
                    raise Refused("give a key to find by key")
                check_str("key", key, MAX_KEY_LEN)
                form["begin"], form["end"] = q.get("begin", ""), q.get("end", "")
                begin = _utc_ms(form["begin"], "from") if form["begin"] else None
                end = _utc_ms(form["end"], "to") if form["end"] else None
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
        msg_id = _msg_id(request.query.get("id", ""))
        topic_text = request.query.get("topic", "")
        topic = _topic_name(topic_text) if topic_text else None
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
        msg_id = _msg_id(str(form.get("id", "")))
        topic_text = str(form.get("topic", ""))
        topic = _topic_name(topic_text) if topic_text else None
        group = _group_name(str(form.get("group", "")).strip())
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
        group = _group_name(text)
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
        group = _group_name(str(form.get("group", "")).strip())
        msg_id = str(form.get("msg_id", "")).strip()
        ids = [_msg_id(msg_id)] if msg_id else None
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
        group = _group_name(text) if text else ""
        pending = await self.call(self.admin.pending_transactions, group or None)
        try:
            coordinator = await self.call(self.admin.transaction_coordinator)
        except Exception as exc:  # noqa: BLE001 - restarting: the half messages still show
            log.info("console: the transaction coordinator did not answer: %s", exc)
            coordinator = {"unanswered": type(exc).__name__}
        title = f"Transactions of {group}" if group else "Transactions"
        body = pages.transactions_page(pending, group, coordinator)
        return self.render(request, title, body, active="transactions")


# ------------------------------------------------------------ input
def _topic_name(text: str) -> str:
    try:
        return validate_topic(text)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was done") from None


def _group_name(text: str) -> str:
    try:
        return validate_group(text)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was done") from None


def _msg_id(text: str) -> str:
    text = text.strip()
    if not text or len(text) > MAX_ID_LEN or not all(c.isalnum() or c in "-_" for c in text):
        raise Refused(
            f"message id {text[:MAX_ID_LEN]!r}: letters, digits, - and _ only, 1..{MAX_ID_LEN}"
        )
    return text


def _perm_field(form: dict[str, str]) -> int:
    perm = _int_field(form, "perm", 0, 7)
    if perm not in (PERM_READ | PERM_WRITE, PERM_READ, PERM_WRITE):
        raise Refused(f"perm={perm}: 6 (read + write), 4 (read only) or 2 (write only)")
    return perm


def _utc_ms(text: str, what: str) -> int:
    """A form's time (``2024-05-01T12:00[:00]``, UTC) as epoch milliseconds."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Refused(f"{what}={text!r}: a time as 2024-05-01T12:00:00 (UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return epoch_ms(moment, what)


def _int_field(form: dict[str, str], name: str, lo: int, hi: int) -> int:
    text = form.get(name, "").strip()
    try:
        value = int(text)
    except ValueError:
        raise Refused(f"{name.replace('_', ' ')}={text!r}: a whole number {lo}..{hi}") from None
    if not lo <= value <= hi:
        raise Refused(f"{name.replace('_', ' ')}={value}: must be in {lo}..{hi}")
    return value


CONSOLE_KEY = web.AppKey("console", Console)


def build_app(config: ConsoleConfig, admin: Admin) -> web.Application:
    """The console as an aiohttp application over ``admin`` (served by the ``console``
    actor, ``actors.console.server``, or in-process by a test)."""
    console = Console(config, admin)
    app = web.Application(middlewares=[console.guard], client_max_size=MAX_REQUEST_BYTES)
    app[CONSOLE_KEY] = console
    r = app.router
    r.add_get("/", console.cluster)
    r.add_get("/topics", console.topics)
    r.add_post("/topics", console.create_topic)
    r.add_get("/topics/{topic}", console.topic)
    r.add_post("/topics/{topic}/send", console.send)
    r.add_post("/topics/{topic}/update", console.update_topic)
    r.add_post("/topics/{topic}/delete", console.delete_topic)
    r.add_get("/groups", console.groups)
    r.add_get("/groups/{group}", console.group)
    r.add_post("/groups/{group}/reset", console.reset)
    r.add_get("/messages", console.messages)
    r.add_get("/message", console.message)
    r.add_get("/dlq", console.dlq)
    r.add_post("/dlq/resend", console.resend)
    r.add_get("/transactions", console.transactions)
    r.add_post("/message/resend", console.resend_to_group)
    r.add_get("/jobs/{job}", console.job)
    r.add_get("/jobs/{job}/progress", console.job_progress)
    r.add_get("/metrics-charts", console.metrics_charts)
    r.add_get("/login", console.login_form)
    r.add_post("/login", console.login)
    r.add_get("/healthz", console.healthz)
    r.add_get("/static/{name}", console.static)

    async def on_startup(app: web.Application) -> None:
        await console.start_sampling()

    async def on_cleanup(app: web.Application) -> None:
        await console.sampler.stop()
        console.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app

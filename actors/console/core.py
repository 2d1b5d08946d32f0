"""The console's shared core: one admin client, its thread pools, the sampler, the jobs,
and the page frame every handler renders into; :class:`View` is the base of the handler
groups (``access``, ``topics``, ``groups``, ``messages``), each over that one core."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from aiohttp import web

from actors.client.admin import Admin
from actors.client.producer import Producer
from actors.config.console import ConsoleConfig
from actors.console import pages
from actors.console.jobs import Jobs
from actors.console.sampler import Sampler

log = logging.getLogger("raymq.actors.console")


CSRF_COOKIE = "raymq_csrf"
SESSION_COOKIE = "raymq_session"
FLASH_COOKIE = "raymq_flash"
PRODUCER_GROUP = "raymq-console"
MAX_REQUEST_BYTES = 16 << 20
"""A request body aiohttp reads at all; the console's own limits (a message body) are
smaller and refused with a message."""
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CSRF = web.RequestKey("csrf", str)
"""This request's CSRF token (the browser's cookie, or a new one the response sets)."""
FLASH = web.RequestKey("flash", str)
"""What the last action did, told once on the page after its redirect."""


def redirect(location: str, notice: str | None = None) -> web.Response:
    response = web.Response(status=303, headers={"Location": location})
    if notice:
        response.set_cookie(
            FLASH_COOKIE, quote(notice[:500]), path="/", httponly=True, samesite="Strict"
        )
    return response


class Console:
    """What one console's handlers share: its admin client, pools, producer, sampler,
    jobs, and the page frame."""

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

    def refusal(self, request: web.Request, message: str, status: int) -> web.Response:
        return self.render(
            request,
            "Refused" if status < 500 else "Error",
            '<p><a href="/">back to the cluster</a></p>',
            active="",
            error=message,
            status=status,
        )


class View:
    """A group of the console's handlers, over its shared :class:`Console`."""

    redirect = staticmethod(redirect)

    def __init__(self, console: Console) -> None:
        self.console = console
        self.config = console.config
        self.admin = console.admin
        self.session = console.session
        self.sampler = console.sampler
        self.jobs = console.jobs
        self.jobs_pool = console.jobs_pool
        self.call = console.call
        self.render = console.render
        self.refusal = console.refusal
        self.producer = console.producer
        self._all_topics = console._all_topics

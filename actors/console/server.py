"""The ``console`` actor: a detached Ray actor on the head node serving the console's
web application (``actors.console.app``) on its own event loop, and the functions
that start it, find its URL and stop it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray
from aiohttp import web
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.client.admin import Admin
from actors.config.console import ConsoleConfig
from actors.console.app import build_app
from actors.protocol import rpc as _rpc
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.console")

CONSOLE_ACTOR = "console"
"""The console's Ray actor name, in the cluster's namespace."""
START_TIMEOUT_S = 60.0
HEAD_RESOURCE = "node:__internal_head__"


class ConsoleServer:
    """The web server of the console (run as the detached actor ``console``)."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.runner: web.AppRunner | None = None
        self._url = ""

    async def start(self) -> str:
        """Bind and serve; the URL to open. Raises ``OSError`` if the port is taken."""
        if self.runner is not None:
            return self._url
        loop = asyncio.get_running_loop()  # finding the NameServers asks Ray: off the loop
        admin = await loop.run_in_executor(None, Admin, self.config.namespace)
        app = build_app(self.config, admin)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.runner = runner
        port = runner.addresses[0][1]
        host = self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = ray.util.get_node_ip_address()
        if ":" in host:
            host = f"[{host}]"
        self._url = f"http://{host}:{port}/"
        log.info("console serving %s at %s", self.config.namespace, self._url)
        return self._url

    async def url(self) -> str:
        return self._url

    async def ping(self) -> str:
        return "pong"

    async def shutdown(self) -> None:
        """Stop serving (``Cluster.shutdown`` calls it on every RayMQ actor)."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def head_node_id() -> str:
    """The Ray head node's id (the caller's node where none is marked head)."""
    for node in ray.nodes():
        if node.get("Alive") and HEAD_RESOURCE in node.get("Resources", {}):
            return str(node["NodeID"])
    return str(ray.get_runtime_context().get_node_id())


def _handle(namespace: str) -> Any:
    try:
        return ray.get_actor(CONSOLE_ACTOR, namespace=namespace)
    except ValueError:
        return None


def start_console(config: ConsoleConfig) -> str:
    """Start the ``console`` actor of ``config.namespace`` on the head node (or find the
    one running) and return its URL."""
    running = console_url(config.namespace)
    if running:
        return running
    handle: Any = _rpc.service_actor(
        ConsoleServer,
        CONSOLE_ACTOR,
        config.namespace,
        max_concurrency=100,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
    ).remote(config)
    try:
        url: str = _rpc.get(handle.start.remote(), START_TIMEOUT_S)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
        if isinstance(exc, OSError):
            raise RayMQError(
                f"the console cannot listen on {config.host}:{config.port}: {exc}"
            ) from exc
        raise
    return url


def console_url(namespace: str, timeout_s: float = 10.0) -> str | None:
    """The URL of the console of ``namespace``, or None when none runs."""
    handle = _handle(namespace)
    if handle is None:
        return None
    try:
        url: str = _rpc.get(handle.url.remote(), timeout_s)
    except Exception as exc:  # noqa: BLE001 - a console that does not answer has no URL
        log.warning("console of %s does not answer: %s", namespace, type(exc).__name__)
        return None
    return url or None


def stop_console(namespace: str, timeout_s: float = 10.0) -> bool:
    """Stop the console of ``namespace``; whether one ran."""
    handle = _handle(namespace)
    if handle is None:
        return False
    with contextlib.suppress(Exception):
        _rpc.get(handle.shutdown.remote(), timeout_s)
    ray.kill(handle, no_restart=True)
    return True

"""The web console: RocketMQ Dashboard's pages for a RayMQ cluster (cluster, topics,
consumer groups, messages, dead letters), served by the detached actor ``console``
and reading everything through the admin client (``actors.client.admin``)."""

from __future__ import annotations

from actors.config.console import ConsoleConfig
from actors.console.app import build_app
from actors.console.server import (
    CONSOLE_ACTOR,
    ConsoleServer,
    console_url,
    start_console,
    stop_console,
)

__all__ = [
    "CONSOLE_ACTOR",
    "ConsoleConfig",
    "ConsoleServer",
    "build_app",
    "console_url",
    "start_console",
    "stop_console",
]

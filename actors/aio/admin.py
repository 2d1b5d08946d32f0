"""AsyncAdmin: the admin's calls awaited from asyncio code.

Administration is the control plane: every call goes to the brokers and NameServers
through Ray, as :class:`~actors.client.admin.Admin`'s do. Each call of the admin
runs on a worker thread (``asyncio.to_thread``), so the event loop goes on serving
while a broker creates a topic; its errors are the synchronous admin's.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

from actors.client.admin import Admin
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.topic import TopicConfig


class AsyncAdmin:
    """Every public method of :class:`~actors.client.admin.Admin` as a coroutine:
    ``await admin.create_topic("orders", 4, 4)``."""

    def __init__(
        self, namespace: str = DEFAULT_NAMESPACE, nameservers: Sequence[str] | None = None
    ) -> None:
        self.admin = Admin(namespace=namespace, nameservers=nameservers)

    async def create_topic(
        self, topic: str, read_queue_nums: int = 8, write_queue_nums: int = 8, **options: Any
    ) -> TopicConfig:
        """``Admin.create_topic``: create (or overwrite) ``topic`` on the live masters;
        the NameServers know it when this returns."""
        return await asyncio.to_thread(
            self.admin.create_topic, topic, read_queue_nums, write_queue_nums, **options
        )

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self.admin, name)
        if not callable(method):
            return method  # type: ignore[no-any-return]

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call

    async def close(self) -> None:
        """Give back the admin's share of the process's client instance."""
        self.admin._lease.release()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

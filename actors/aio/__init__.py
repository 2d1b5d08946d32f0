"""asyncio clients: sends on the caller's event loop.

They speak the brokers' framed protocol (``actors.protocol``) over connections of
their own on the loop that uses them (``actors.aio.connection``), and share routes,
broker handles, heartbeats and the process's client id with the synchronous clients
(``actors.client.instance``). Administration (``AsyncAdmin``) is the control plane:
its calls go through Ray on a worker thread.
"""

from actors.aio.admin import AsyncAdmin
from actors.aio.producer import AsyncProducer

__all__ = ["AsyncAdmin", "AsyncProducer"]

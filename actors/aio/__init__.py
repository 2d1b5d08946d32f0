"""asyncio clients: sends, consumption and POP on the caller's event loop.

They speak the brokers' framed protocol (``actors.protocol``) over connections of
their own on the loop that uses them (``actors.aio.connection``), and share routes,
broker handles, heartbeats and the process's client id with the synchronous clients
(``actors.client.instance``). Transactions (``AsyncTransactionalProducer``) answer
their brokers' checks on the loop too. Administration (``AsyncAdmin``) is the control plane:
its calls go through Ray on a worker thread.
"""

from actors.aio.admin import AsyncAdmin
from actors.aio.consumer import AsyncConsumer, ConsumedMessage
from actors.aio.lite import AsyncLiteConsumer, AsyncLiteProducer
from actors.aio.producer import AsyncProducer
from actors.aio.simple_consumer import AsyncSimpleConsumer
from actors.aio.transaction import AsyncHalf, AsyncTransaction, AsyncTransactionalProducer

__all__ = [
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncHalf",
    "AsyncLiteConsumer",
    "AsyncLiteProducer",
    "AsyncProducer",
    "AsyncSimpleConsumer",
    "AsyncTransaction",
    "AsyncTransactionalProducer",
    "ConsumedMessage",
]

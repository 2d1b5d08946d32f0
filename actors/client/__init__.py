"""The clients: the Producer and its send machinery, the PullConsumer, the PushConsumer
(``push/``), the SimpleConsumer, the transactional producers and the admin client. All
of a process's clients of one cluster share one client instance (``instance``: routes,
broker handles, connections, heartbeats). They talk to brokers only through
``actors.protocol``."""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from actors.client.admin import Admin
    from actors.client.backpressure import ProducerBusyError
    from actors.client.producer import Producer
    from actors.client.pull_consumer import PullConsumer, PullResult, PullStatus
    from actors.client.push import (
        ConsumeFromWhere,
        ConsumeStatus,
        MessageModel,
        PushConsumer,
        PushConsumerConfig,
    )
    from actors.client.send_result import BatchSendResult, SendResult, SendStatus
    from actors.client.simple_consumer import SimpleConsumer
    from actors.client.transaction import (
        LocalTransactionState,
        TransactionListener,
        TransactionProducer,
        TransactionSendResult,
    )
    from actors.client.transactional import (
        Transaction,
        TransactionalProducer,
        TransactionState,
    )

# Imported from its module when first used (PEP 562), as ``actors`` does: a broker's
# keeper needs ``Admin``, not the push consumer or the transactional producers.
_EXPORTS: dict[str, str] = {
    "Admin": "actors.client.admin",
    "ProducerBusyError": "actors.client.backpressure",
    "Producer": "actors.client.producer",
    "PullConsumer": "actors.client.pull_consumer",
    "PullResult": "actors.client.pull_consumer",
    "PullStatus": "actors.client.pull_consumer",
    "ConsumeFromWhere": "actors.client.push",
    "ConsumeStatus": "actors.client.push",
    "MessageModel": "actors.client.push",
    "PushConsumer": "actors.client.push",
    "PushConsumerConfig": "actors.client.push",
    "BatchSendResult": "actors.client.send_result",
    "SendResult": "actors.client.send_result",
    "SendStatus": "actors.client.send_result",
    "SimpleConsumer": "actors.client.simple_consumer",
    "LocalTransactionState": "actors.client.transaction",
    "TransactionListener": "actors.client.transaction",
    "TransactionProducer": "actors.client.transaction",
    "TransactionSendResult": "actors.client.transaction",
    "Transaction": "actors.client.transactional",
    "TransactionalProducer": "actors.client.transactional",
    "TransactionState": "actors.client.transactional",
}


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'actors.client' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Admin",
    "BatchSendResult",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "LocalTransactionState",
    "MessageModel",
    "Producer",
    "ProducerBusyError",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerConfig",
    "SendResult",
    "Transaction",
    "TransactionState",
    "TransactionalProducer",
    "SendStatus",
    "SimpleConsumer",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

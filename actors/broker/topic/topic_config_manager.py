"""A broker's topics (RocketMQ's ``TopicConfigManager``), persisted in ``config/topics.json``.

Invariant: the file always holds the table as of the last change that was
acknowledged to a caller (each change is saved before the call returns).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from actors.protocol.topic import (
    AUTO_CREATE_TOPIC_KEY,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
)
from storage.config_files import JsonConfigFile
from storage.errors import InvalidMessageError, PermissionDeniedError, TopicNotFoundError

log = logging.getLogger("raymq.actors.topics")


class TopicConfigManager:
    def __init__(
        self, file: JsonConfigFile, broker_name: str, *, auto_create: bool, default_queue_nums: int
    ) -> None:
        self._file = file
        self._lock = threading.Lock()
        self.broker_name = broker_name
        self.auto_create = auto_create
        self.default_queue_nums = default_queue_nums
        self.data_version = 0
        self._table: dict[str, TopicConfig] = {}
        for name, raw in (file.load().get("topicConfigTable") or {}).items():
            try:
                self._table[name] = TopicConfig.from_dict(raw)
            except ValueError as exc:
                log.error("ignoring bad topic config %r in %s: %s", name, file.path, exc)
        if auto_create:
            self._table[AUTO_CREATE_TOPIC_KEY] = TopicConfig(
                AUTO_CREATE_TOPIC_KEY,
                default_queue_nums,
                default_queue_nums,
                PERM_READ | PERM_WRITE | PERM_INHERIT,
            )
        else:
            self._table.pop(AUTO_CREATE_TOPIC_KEY, None)

    def _save(self) -> None:
        self.data_version += 1
        self._file.save(
            {
                "topicConfigTable": {
                    name: tc.to_dict() for name, tc in sorted(self._table.items())
                },
                "dataVersion": {"counter": self.data_version, "timestamp": int(time.time() * 1000)},
            }
        )

    def snapshot(self) -> dict[str, TopicConfig]:
        return dict(self._table)

    def get(self, topic: str) -> TopicConfig | None:
        return self._table.get(topic)

    def put(self, config: TopicConfig) -> TopicConfig:
        with self._lock:
            self._table[config.topic_name] = config
            self._save()
        log.info(
            "topic %s on %s: read %d write %d perm %d",
            config.topic_name,
            self.broker_name,
            config.read_queue_nums,
            config.write_queue_nums,
            config.perm,
        )
        return config

    def delete(self, topic: str) -> bool:
        with self._lock:
            if self._table.pop(topic, None) is None:
                return False
            self._save()
        return True

    def for_write(
        self, topic: str, queue_id: int, auto_create_queue_nums: int = 0
    ) -> tuple[TopicConfig, bool]:
        """The topic's config for a send to ``queue_id`` (auto-created when allowed);
        the flag says the topic was created now."""
        tc = self._table.get(topic)
        created = False
        if tc is None:
            if not self.auto_create:
                raise TopicNotFoundError(
                    f"topic={topic!r} does not exist on broker {self.broker_name} and "
                    "auto_create_topic_enable is off: create it first (raymq topic create)"
                )
            nums = min(auto_create_queue_nums or self.default_queue_nums, self.default_queue_nums)
            with self._lock:
                tc = self._table.get(topic)
                if tc is None:
                    tc = TopicConfig(topic, nums, nums)
                    self._table[topic] = tc
                    self._save()
                    created = True
                    log.info(
                        "auto-created topic %s on %s with %d queues", topic, self.broker_name, nums
                    )
        self._check_queue(tc, queue_id, write=True)
        return tc, created

    def for_read(self, topic: str, queue_id: int) -> TopicConfig:
        tc = self._table.get(topic)
        if tc is None:
            raise TopicNotFoundError(f"topic={topic!r} does not exist on broker {self.broker_name}")
        self._check_queue(tc, queue_id, write=False)
        return tc

    def _check_queue(self, tc: TopicConfig, queue_id: int, *, write: bool) -> None:
        """``PermissionDeniedError`` if ``tc``'s perm forbids the access,
        ``InvalidMessageError`` if ``queue_id`` is not one of its write (read) queues."""
        access, allowed = ("writing", tc.writeable) if write else ("reading", tc.readable)
        if not allowed:
            raise PermissionDeniedError(
                f"topic={tc.topic_name!r} on broker {self.broker_name} has perm={tc.perm}: "
                f"{access} is forbidden"
            )
        field, nums = (
            ("write_queue_nums", tc.write_queue_nums)
            if write
            else ("read_queue_nums", tc.read_queue_nums)
        )
        if queue_id >= nums:
            raise InvalidMessageError(
                f"queue_id={queue_id} for topic {tc.topic_name!r} on broker {self.broker_name}: "
                f"must be < {field}={nums}"
            )

    def describe(self) -> list[dict[str, Any]]:
        return [{"topic": name, **tc.to_dict()} for name, tc in sorted(self._table.items())]

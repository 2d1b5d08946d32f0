"""The admin client's topics: create, change, delete and list them, their routes and
status, and the messages they hold looked up by key or by id."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from actors.client.admin_base import ADMIN_TIMEOUT_S, INDEX_TIME_RESOLUTION_MS, AdminBase, epoch_ms
from actors.protocol import rpc as _rpc
from actors.protocol.route import TopicRouteData
from actors.protocol.topic import (
    PERM_READ,
    PERM_WRITE,
    SYSTEM_TOPICS,
    TopicConfig,
    is_system_topic,
)
from storage import codec
from storage.errors import (
    InvalidMessageError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    TopicNotFoundError,
)
from storage.message import MessageExt

log = logging.getLogger("raymq.actors.admin")


class TopicAdmin(AdminBase):
    """Topics and their messages (see the module doc)."""

    # ------------------------------------------------------------ topics
    def create_topic(
        self,
        topic: str,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ | PERM_WRITE,
        *,
        order: bool = False,
        brokers: Sequence[str] | None = None,
    ) -> TopicConfig:
        """Create (or overwrite) ``topic`` on the given brokers (default: every live master);
        the NameServers know it when this returns."""
        config = TopicConfig(topic, read_queue_nums, write_queue_nums, perm, order)
        self._on_all(self._brokers_for(brokers), "create_topic", config)
        self.ns.invalidate(topic)
        return config

    def update_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int | None = None,
        write_queue_nums: int | None = None,
        perm: int | None = None,
        brokers: Sequence[str] | None = None,
    ) -> dict[str, TopicConfig]:
        """Change some fields of an existing topic on the brokers that hold it."""
        self._refuse_system(topic, "changed")
        targets = self._brokers_for(brokers) if brokers else self._topic_brokers(topic)
        current = self._on_all(targets, "get_topic_config", topic)
        out = {}
        for name, tc in current.items():
            if tc is None:
                raise TopicNotFoundError(f"topic={topic!r} does not exist on broker {name}")
            out[name] = TopicConfig(
                topic,
                read_queue_nums if read_queue_nums is not None else tc.read_queue_nums,
                write_queue_nums if write_queue_nums is not None else tc.write_queue_nums,
                perm if perm is not None else tc.perm,
                tc.order,
            )
        for name, config in out.items():
            _rpc.get(targets[name].create_topic.remote(config), ADMIN_TIMEOUT_S)
        self.ns.invalidate(topic)
        return out

    def delete_topic(self, topic: str) -> list[str]:
        """Delete ``topic`` (its config and offsets; stored messages expire as usual)."""
        self._refuse_system(topic, "deleted")
        done = self._on_all(self._topic_brokers(topic), "delete_topic", topic)
        self.ns.invalidate(topic)
        return sorted(name for name, removed in done.items() if removed)

    def _refuse_system(self, topic: str, what: str) -> None:
        """Refuse a system topic (whether or not it exists) as every broker would."""
        info = self.ns.call("get_cluster_info")
        if is_system_topic(topic, *info["clusters"], *info["brokers"]):
            raise PermissionDeniedError(f"topic={topic!r} is a system topic: it cannot be {what}")

    def list_topics(self, *, include_system: bool = False) -> list[str]:
        topics = self.ns.call("get_all_topics")
        return [t for t in topics if include_system or t not in SYSTEM_TOPICS]

    def topic_route(self, topic: str) -> TopicRouteData:
        return self.ns.require_route(topic, refresh=True)

    def topic_status(self, topic: str) -> list[dict[str, Any]]:
        """Per broker and queue: min/max offset and last store time."""
        rows: list[dict[str, Any]] = []
        for _, part in sorted(
            self._on_all(self._topic_brokers(topic), "topic_status", topic).items()
        ):
            rows.extend(part)
        return rows

    # ------------------------------------------------------------ lookups
    def query_by_key(
        self,
        topic: str,
        key: str,
        max_count: int = 64,
        begin: int | datetime | None = None,
        end: int | datetime | None = None,
    ) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` (or unique key ``key``) stored between
        ``begin`` and ``end`` (inclusive; epoch ms or datetimes; open when ``None``),
        oldest first. The index keeps store times to the second, so the brokers are asked
        from a second before ``begin`` and their answers cut at the exact store times."""
        begin_ms = epoch_ms(begin, "begin") if begin is not None else 0
        end_ms = epoch_ms(end, "end") if end is not None else None
        if end_ms is not None and end_ms < begin_ms:
            raise InvalidMessageError(f"query_by_key: end={end_ms} is before begin={begin_ms}")
        found: list[MessageExt] = []
        for _, msgs in sorted(
            self._on_all(
                self._topic_brokers(topic),
                "query_by_key",
                topic,
                key,
                max_count,
                max(begin_ms - INDEX_TIME_RESOLUTION_MS, 0),
                end_ms,
            ).items()
        ):
            found.extend(
                m
                for m in msgs
                if begin_ms <= m.store_timestamp and (end_ms is None or m.store_timestamp <= end_ms)
            )
        return sorted(found, key=lambda m: m.store_timestamp)[:max_count]

    def query_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """By offset message id (any broker), or by unique key when ``topic`` is given."""
        try:
            host, _ = codec.parse_offset_msg_id(msg_id)
        except Exception:  # noqa: BLE001 - not an offset id: a unique key
            host = None
        info = self.ns.call("get_cluster_info")
        if host is not None:
            for entry in info["brokers"].values():
                for member in entry["members"].values():
                    if member["addr"] == host:
                        h = self.ns.broker_by_name(member["actor_name"], member["namespace"])
                        return _rpc.get(h.message_by_id.remote(msg_id, topic), ADMIN_TIMEOUT_S)
        if topic is None:
            raise OffsetOutOfRangeError(
                f"msg_id={msg_id!r}: no live broker has store host {host!r}; "
                "give the topic to search by unique key"
            )
        for msgs in self._on_all(
            self._topic_brokers(topic), "query_by_key", topic, msg_id, 1
        ).values():
            if msgs:
                return msgs[0]
        raise OffsetOutOfRangeError(f"no message with id {msg_id!r} in topic {topic!r}")

    def set_topic_perm(self, topic: str, perm: int) -> dict[str, TopicConfig]:
        """Change ``topic``'s perm (2 write only, 4 read only, 6 both) on every broker
        holding it; e.g. 6 on a ``%DLQ%<group>`` lets consumers read it."""
        return self.update_topic(topic, perm=perm)

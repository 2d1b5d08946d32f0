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
    InvalidConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    TopicNotFoundError,
)
from storage.lite import validate_lite_name
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

    # ------------------------------------------------------------ LITE parents
    def create_lite_topic(
        self,
        parent: str,
        *,
        quota: int | None = None,
        ttl_ms: int | None = None,
        brokers: Sequence[str] | None = None,
    ) -> dict[str, dict[str, int]]:
        """Create ``parent`` as a topic of type LITE on the given brokers (default: every
        live master), or change its quota (live lite topics per broker) and TTL (ms after
        a lite topic's last write); the brokers' defaults when None. Checked on every
        broker before any changes: a quota below a broker's live lite topics is
        refused. Per broker: quota, TTL, live lite topics."""
        codec.validate_topic(parent)
        for what, value in (("quota", quota), ("ttl_ms", ttl_ms)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise InvalidConfigError(f"{what}={value!r}: must be an int > 0")
        self._refuse_system(parent, "a LITE parent")
        targets = self._brokers_for(brokers)
        if quota is not None:
            held = self._on_all(targets, "lite_parents")
            for name, used in self._lite_counts(parent, targets, held).items():
                if quota < used:
                    raise InvalidConfigError(
                        f"quota={quota} for LITE topic {parent!r}: broker {name} holds "
                        f"{used} of its lite topics"
                    )
        done: dict[str, dict[str, int]] = {}
        for name, made in self._on_all(
            targets, "lite_create_parent", parent, quota, ttl_ms
        ).items():
            done[name] = {k: v for k, v in made.items() if k != "parent"}
        self.ns.invalidate(parent)
        return done

    def _lite_counts(
        self, parent: str, targets: dict[str, Any], held: dict[str, Any]
    ) -> dict[str, int]:
        asked = [n for n in targets if parent in held[n]]
        counts = self._on_all({n: targets[n] for n in asked}, "lite_describe_parent", parent)
        return {n: c["lite_topics"] for n, c in counts.items()}

    def lite_parents(self) -> list[str]:
        """The topics of type LITE on the live masters, sorted."""
        found = self._on_all(self.brokers(), "lite_parents")
        return sorted({p for parents in found.values() for p in parents})

    def describe_lite_topic(self, parent: str) -> dict[str, Any]:
        """A LITE parent: per broker its quota, TTL and live lite topics, and the totals
        (``lite_topics``, ``quota``, ``quota_used`` as a fraction)."""
        per = self._on_all(self._topic_brokers(parent), "lite_describe_parent", parent)
        total = sum(p["lite_topics"] for p in per.values())
        quota = sum(p["quota"] for p in per.values())
        return {
            "parent": parent,
            "lite_topics": total,
            "quota": quota,
            "quota_used": total / quota if quota else 0.0,
            "ttl_ms": max((p["ttl_ms"] for p in per.values()), default=0),
            "brokers": dict(sorted(per.items())),
        }

    def list_lite_topics(self, parent: str, after: str = "", limit: int = 100) -> dict[str, Any]:
        """One page of ``parent``'s live lite topics sorted by name, those after
        ``after``: ``{"lite_topics", "total", "next"}``; ``next`` is the ``after`` of the
        next page (None on the last). Each broker sorts its own: a page costs a walk
        of every broker's table."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise InvalidMessageError(f"limit={limit!r}: an int from 1 to 10000")
        pages = self._on_all(self._topic_brokers(parent), "lite_topics_page", parent, after, limit)
        names = sorted(n for page in pages.values() for n in page["lite_topics"])[:limit]
        total = sum(page["total"] for page in pages.values())
        more = sum(page["remaining"] for page in pages.values()) > len(names)
        last = names[-1] if names else None
        return {"lite_topics": names, "total": total, "next": last if more else None}

    def lite_topic_status(self, parent: str, lite_topic: str) -> dict[str, Any]:
        """One lite topic: its broker, min and max offsets, last write (ms) and per
        consumer group its committed offset, lag and owning client."""
        validate_lite_name(lite_topic)
        found = self._on_all(self._topic_brokers(parent), "lite_describe_topic", parent, lite_topic)
        for name, info in sorted(found.items()):
            if info is not None:
                return {"broker": name, **info}
        raise TopicNotFoundError(f"lite topic {lite_topic!r} of {parent!r} does not exist")

    def delete_lite_topic(self, parent: str, lite_topic: str) -> list[str]:
        """Delete a lite topic now with its groups' offsets (a later send creates it
        anew from offset 0): the brokers it was deleted on."""
        validate_lite_name(lite_topic)
        done = self._on_all(self._topic_brokers(parent), "lite_delete_topic", parent, lite_topic)
        if not any(done.values()):
            raise TopicNotFoundError(f"lite topic {lite_topic!r} of {parent!r} does not exist")
        return sorted(name for name, deleted in done.items() if deleted)

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

"""Admin operations over a running cluster (RocketMQ's ``mqadmin``): topics, status,
lookups, consumer lag and offset resets. Control plane only; every call here
talks to the NameServers and brokers directly."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import ray

from actors.client import dlq as _dlq
from actors.client.send_result import SendResult
from actors.coordinator.txn import TXN_COORDINATOR_NAME
from actors.namesrv.client import NameServerClient
from actors.protocol import rpc as _rpc
from actors.protocol.checks import check_number, validate_group
from actors.protocol.errors import PromotionRefusedError
from actors.protocol.names import DEFAULT_NAMESPACE, coordinator_actor_name, fleet_actor_name
from actors.protocol.route import TopicRouteData
from actors.protocol.topic import (
    PERM_READ,
    PERM_WRITE,
    SYSTEM_TOPICS,
    TopicConfig,
    dlq_topic,
    is_system_topic,
    retry_topic,
)
from rebalance import MessageQueue
from storage import codec
from storage.errors import (
    BrokerUnavailableError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    RayMQError,
    TopicNotFoundError,
)
from storage.message import Message, MessageExt

log = logging.getLogger("raymq.actors.admin")

ADMIN_TIMEOUT_S = 30.0
INDEX_TIME_RESOLUTION_MS = 1000  # an IndexFile entry keeps its store time in seconds
RESET_POSITIONS = ("earliest", "latest")


class Admin:
    def __init__(
        self, namespace: str = DEFAULT_NAMESPACE, nameservers: Sequence[str] | None = None
    ) -> None:
        from actors.namesrv.client import discover_nameservers

        self.namespace = namespace
        self.ns = NameServerClient(nameservers or discover_nameservers(namespace), namespace, 0.0)

    # ------------------------------------------------------------ brokers
    def brokers(self) -> dict[str, Any]:
        """Live master brokers by broker name (as the NameServers see them)."""
        return self.ns.master_brokers()

    def _brokers_for(self, names: Sequence[str] | None) -> dict[str, Any]:
        live = self.brokers()
        if names is None:
            if not live:
                raise BrokerUnavailableError(f"no live broker in namespace {self.namespace!r}")
            return live
        missing = [n for n in names if n not in live]
        if missing:
            raise BrokerUnavailableError(f"broker(s) {missing} are not live; live: {sorted(live)}")
        return {n: live[n] for n in names}

    def _on_all(self, brokers: dict[str, Any], method: str, *args: Any) -> dict[str, Any]:
        refs = {name: getattr(h, method).remote(*args) for name, h in brokers.items()}
        return {name: _rpc.get(ref, ADMIN_TIMEOUT_S) for name, ref in refs.items()}

    def _topic_brokers(self, topic: str) -> dict[str, Any]:
        route = self.ns.require_route(topic, refresh=True)
        return {
            qd.broker_name: self.ns.broker(route, qd.broker_name)
            for qd in route.queue_datas
            if route.broker(qd.broker_name) is not None
        }

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

    # ------------------------------------------------------------ consumers
    def consumer_lag(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        """Per queue: broker max offset, the group's committed offset and the lag."""
        brokers = self._topic_brokers(topic) if topic else self.brokers()
        rows: list[dict[str, Any]] = []
        for _, part in sorted(self._on_all(brokers, "consumer_lag", group, topic).items()):
            rows.extend(part)
        return rows

    def consumer_list(self, group: str) -> list[str]:
        members: set[str] = set()
        for part in self._on_all(self.brokers(), "consumer_list", group).values():
            members.update(part)
        return sorted(members)

    def set_group_fifo(
        self, group: str, fifo: bool = True, *, brokers: Sequence[str] | None = None
    ) -> None:
        """Make ``group`` a FIFO group on the given brokers (default: every live master):
        its POP consumers (the SimpleConsumer, RocketMQ 5's clients, told so in their
        settings) get each queue in order, one batch in flight at a time; kept across
        restarts (RocketMQ's subscription group ``consumeMessageOrderly``)."""
        self._on_all(self._brokers_for(brokers), "set_group_fifo", group, fifo)

    def group_status(self, group: str) -> dict[str, Any]:
        """What ``group``'s coordinator holds: members, generation, strategy, target and
        current owners, pending revokes and fences, and the generation log."""
        handle = self._coordinator(group)
        if handle is None:
            raise RayMQError(
                f"group={group!r} has no coordinator in namespace {self.namespace!r} "
                "(no coordinated consumer joined it)"
            )
        status: dict[str, Any] = _rpc.get(handle.status.remote(), ADMIN_TIMEOUT_S)
        return status

    def reset_offset(
        self,
        group: str,
        topic: str,
        to: int | str | datetime,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[MessageQueue, int]:
        """Move ``group`` on ``topic`` to ``to``: the first message stored at or after a
        time (epoch ms or a datetime), or ``"earliest"`` / ``"latest"``; its running
        consumers drop their offsets in memory and go on from there. A group with a
        coordinator is reset through it, which restarts the owners at once; otherwise the
        brokers fence the queues, and each consumer sees it on its next rebalance (or its
        next refused commit) and starts again from the new offsets. Returns the offsets.

        ``progress(queues_done, queues)`` is called as brokers answer (once for a
        group with a coordinator, which resets every queue in one step)."""
        timestamp_ms, offsets = self._reset_target(topic, to)
        coordinator = self._coordinator(group)
        if coordinator is not None:
            done: dict[MessageQueue, int] = _rpc.get(
                coordinator.reset_offsets.remote(topic, timestamp_ms, offsets), ADMIN_TIMEOUT_S
            )
            if progress is not None:
                progress(len(done), len(done))
            return done
        brokers = self._topic_brokers(topic)
        route = self.ns.require_route(topic)
        total = sum(q.read_queue_nums for q in route.queue_datas if q.broker_name in brokers)
        refs = {}
        for name, handle in brokers.items():
            mine = None
            if offsets is not None:
                mine = {mq.queue_id: off for mq, off in offsets.items() if mq.broker_name == name}
            refs[name] = handle.reset_offsets.remote(group, topic, timestamp_ms, mine)
        out = {}
        for name, ref in refs.items():
            for qid, off in _rpc.get(ref, ADMIN_TIMEOUT_S).items():
                out[MessageQueue(topic, name, qid)] = off
            if progress is not None:
                progress(len(out), max(total, len(out)))
        return out

    def _reset_target(
        self, topic: str, to: int | str | datetime
    ) -> tuple[int | None, dict[MessageQueue, int] | None]:
        """``to`` as a time in ms, or as explicit offsets for earliest / latest."""
        if isinstance(to, str) and to in RESET_POSITIONS:
            column = "min_offset" if to == "earliest" else "max_offset"
            offsets = {
                MessageQueue(topic, row["broker"], row["queue_id"]): row[column]
                for row in self.topic_status(topic)
            }
            return None, offsets
        if isinstance(to, str):
            raise InvalidMessageError(
                f"reset to={to!r}: a time (epoch ms or a datetime) or one of {RESET_POSITIONS}"
            )
        return epoch_ms(to, "to"), None

    def _coordinator(self, group: str) -> Any:
        """``group``'s coordinator, or None when it has none."""
        try:
            return ray.get_actor(coordinator_actor_name(group), namespace=self.namespace)
        except ValueError:
            return None

    # ------------------------------------------------------------ transactions
    def pending_transactions(self, group: str | None = None) -> list[dict[str, Any]]:
        """Half messages not committed or rolled back yet, on every live master, oldest
        first: broker, message id, producer group, real topic, age (s), checks so far."""
        rows = [
            {"broker": name, **row}
            for name, found in self._on_all(self.brokers(), "pending_transactions").items()
            for row in found
            if group is None or row["group"] == group
        ]
        return sorted(rows, key=lambda r: -r["age_s"])

    def transaction_coordinator(self) -> dict[str, Any] | None:
        """The transaction coordinator of multi-message transactions, as its
        ``status()`` says: its log, each transactional id's producer id and epoch
        (``producers``), the decisions some broker has yet to apply (``pending``), how
        many it found to apply at its last start (``recovered``), its counters
        (``stats``) and its socket (``door``); None when none runs (the first
        ``TransactionalProducer`` starts it). Beside it, ``one_phase``: per master, the
        transactions it committed alone without the coordinator (``actors.broker.one_phase``;
        since its start), or the reason it did not answer."""
        try:
            handle = ray.get_actor(TXN_COORDINATOR_NAME, namespace=self.namespace)
        except ValueError:
            return None
        status: dict[str, Any] = _rpc.get(handle.status.remote(), ADMIN_TIMEOUT_S)
        one_phase: dict[str, Any] = {}
        brokers = self.brokers()
        refs = {name: h.status.remote() for name, h in brokers.items()}
        for name, ref in refs.items():
            try:
                one_phase[name] = int(_rpc.get(ref, ADMIN_TIMEOUT_S).get("txn_one_phase", 0))
            except Exception as exc:  # noqa: BLE001 - one silent broker hides no other
                one_phase[name] = f"no answer ({type(exc).__name__})"
        status["one_phase"] = one_phase
        return status

    # ------------------------------------------------------------ dead letters and perms
    def dlq_messages(self, group: str, max_count: int = 1000) -> list[MessageExt]:
        """The dead letters of ``group`` (``%DLQ%<group>`` on every broker), oldest first."""
        return _dlq.dlq_messages(self._dlq_brokers(group), group, max_count, ADMIN_TIMEOUT_S)

    def resend_dlq(
        self,
        group: str,
        msg_ids: Sequence[str] | None = None,
        max_count: int = 10_000,
        progress: Callable[[int, int], None] | None = None,
        chunk: int = 256,
    ) -> list[SendResult]:
        """Send dead letters of ``group`` (all, or those with the given message ids) back
        to their original topics; one ``SendResult`` per message resent.
        ``progress(resent, letters)`` is called after each batch of ``chunk``."""
        return _dlq.resend_dlq(
            self._dlq_brokers(group),
            group,
            msg_ids,
            max_count,
            ADMIN_TIMEOUT_S,
            namespace=self.namespace,
            nameservers=self.ns.nameservers,
            progress=progress,
            chunk=chunk,
        )

    def resend_to_group(self, msg_id: str, group: str, topic: str | None = None) -> SendResult:
        """Deliver a stored message once more to ``group`` alone: a copy (same id, keys,
        tags and body, ``RETRY_TOPIC`` = its topic) goes to ``%RETRY%<group>``, which the
        group's consumers read besides their topics (RocketMQ Dashboard's resend)."""
        from actors.client.producer import Producer

        validate_group(group)
        m = self.query_by_id(msg_id, topic)
        retry = retry_topic(group)
        made = self._on_all(self.brokers(), "create_retry_topic", group)
        if any(made.values()):
            log.info(
                "created %s for a resend on %s", retry, sorted(n for n, v in made.items() if v)
            )
        props = {k: v for k, v in m.properties.items() if k not in _dlq.NOT_RESENT}
        props[codec.PROP_RETRY_TOPIC] = m.properties.get(codec.PROP_RETRY_TOPIC, m.topic)
        props[codec.PROP_ORIGIN_MESSAGE_ID] = m.msg_id
        copy = Message(retry, m.body, tags=m.tags, keys=m.keys, properties=props, flag=m.flag)
        producer = Producer(
            _dlq.RESEND_GROUP, namespace=self.namespace, nameservers=self.ns.nameservers
        )
        try:
            result = producer.send(copy)
        finally:
            producer.close()
        log.info("resent %s of %s to group %s", m.msg_id, m.topic, group)
        return result

    def _dlq_brokers(self, group: str) -> dict[str, Any]:
        try:
            return self._topic_brokers(dlq_topic(group))
        except TopicNotFoundError:
            return {}

    def set_topic_perm(self, topic: str, perm: int) -> dict[str, TopicConfig]:
        """Change ``topic``'s perm (2 write only, 4 read only, 6 both) on every broker
        holding it; e.g. 6 on a ``%DLQ%<group>`` lets consumers read it."""
        return self.update_topic(topic, perm=perm)

    # ------------------------------------------------------------ high availability
    def promote(
        self,
        broker_name: str,
        broker_id: int | None = None,
        *,
        role: str | None = None,
        force: bool = False,
        status_timeout_s: float = 10.0,
    ) -> dict[str, Any]:
        """Make a slave of ``broker_name`` its master (``raymq broker promote``): by default
        the slave holding the most. Refused while the master is live, for a slave behind
        the last offset a SYNC_MASTER acknowledged, and (unless ``force``) for a slave
        another one is ahead of, or while a registered slave does not answer within
        ``status_timeout_s`` (it may hold what the others lack)."""
        status_timeout_s = check_number("status_timeout_s", status_timeout_s, 0.1)
        info = self.ns.call("get_cluster_info")
        group = info["brokers"].get(broker_name, {}).get("members", {})
        if 0 in group and not force:
            raise PromotionRefusedError(
                f"broker {broker_name} has a live master ({group[0]['actor_name']}): "
                "a slave is promoted only when the master is gone"
            )
        asked: dict[int, tuple[Any, Any]] = {}
        silent: dict[int, str] = {}
        for bid, member in group.items():
            if bid == 0:
                continue
            try:  # a fresh handle: a slave restarted under its name is a new actor
                handle = ray.get_actor(member["actor_name"], namespace=member["namespace"])
                asked[bid] = (handle, handle.status.remote())
            except Exception as exc:  # noqa: BLE001 - gone since it registered
                silent[bid] = f"{type(exc).__name__}: {exc}"
        deadline = time.monotonic() + status_timeout_s  # asked together, waited for once
        slaves: dict[int, tuple[Any, dict[str, Any]]] = {}
        for bid, (handle, ref) in asked.items():
            try:
                slaves[bid] = (handle, _rpc.get(ref, max(0.0, deadline - time.monotonic())))
            except Exception as exc:  # noqa: BLE001 - a slave that does not answer is not a candidate
                silent[bid] = type(exc).__name__
        if silent and not force:
            said = ", ".join(f"{b} ({why})" for b, why in sorted(silent.items()))
            raise PromotionRefusedError(
                f"slave(s) of {broker_name} did not answer within {status_timeout_s:g} s: "
                f"{said}; one of them may hold messages the others lack: promote when "
                "every slave answers (or force, among those that do)"
            )
        if not slaves:
            raise BrokerUnavailableError(f"broker {broker_name} has no live slave to promote")
        confirmed = max(s.get("ha_confirmed_offset", 0) for _, s in slaves.values())
        best = max(slaves, key=lambda b: slaves[b][1]["commitlog_max_offset"])
        bid = best if broker_id is None else broker_id
        if bid not in slaves:
            raise BrokerUnavailableError(
                f"broker {broker_name} has no live slave with id {bid}; live: {sorted(slaves)}"
            )
        handle, status = slaves[bid]
        ahead = slaves[best][1]["commitlog_max_offset"]
        if not force and status["commitlog_max_offset"] < ahead:
            raise PromotionRefusedError(
                f"slave {bid} of {broker_name} holds the commitlog up to "
                f"{status['commitlog_max_offset']}, slave {best} up to {ahead}: promote {best} "
                "(or force)"
            )
        result: dict[str, Any] = _rpc.get(
            handle.promote.remote(role, confirmed, force), ADMIN_TIMEOUT_S
        )
        return result

    # ------------------------------------------------------------ rates and fleets
    def counters(self) -> dict[str, dict[str, Any]]:
        """Every live master's running totals (``Broker.counters``) by broker name: what
        the console samples for its rates and charts. A broker that does not answer is
        left out (its rates pause)."""
        brokers = self.brokers()
        refs = {name: h.counters.remote() for name, h in brokers.items()}
        out: dict[str, dict[str, Any]] = {}
        for name, ref in refs.items():
            try:
                out[name] = _rpc.get(ref, 10.0)
            except Exception as exc:  # noqa: BLE001 - a missed sample, not a failure
                log.info("counters of %s: %s", name, type(exc).__name__)
        return out

    def fleet_status(self, group: str) -> dict[str, Any] | None:
        """The status of ``group``'s consumer fleet (``ConsumerFleet.status``), or None
        when the group runs no fleet."""
        try:
            handle = ray.get_actor(fleet_actor_name(group), namespace=self.namespace)
        except ValueError:
            return None
        status: dict[str, Any] = _rpc.get(handle.status.remote(), ADMIN_TIMEOUT_S)
        return status

    # ------------------------------------------------------------ cluster
    def cluster_status(self) -> dict[str, Any]:
        """NameServers (alive or not) and every live broker's status."""
        nameservers = []
        for name in self.ns.nameservers:
            try:
                handle = ray.get_actor(name, namespace=self.namespace)
                info = _rpc.get(handle.get_cluster_info.remote(), 5.0)
                nameservers.append(
                    {
                        "name": name,
                        "alive": True,
                        "brokers": sorted(info["brokers"]),
                        "uptime_s": info["uptime_s"],
                    }
                )
            except Exception as exc:  # noqa: BLE001 - report, do not fail
                nameservers.append({"name": name, "alive": False, "error": type(exc).__name__})
        info = self.ns.call("get_cluster_info")
        brokers = []
        for broker_name, entry in sorted(info["brokers"].items()):
            for bid, member in sorted(entry["members"].items()):
                h = self.ns.broker_by_name(member["actor_name"], member["namespace"])
                try:
                    brokers.append(_rpc.get(h.status.remote(), 10.0))
                except Exception as exc:  # noqa: BLE001
                    brokers.append(
                        {
                            "broker_name": broker_name,
                            "broker_id": bid,
                            "actor_name": member["actor_name"],
                            "error": repr(exc),
                        }
                    )
        return {"namespace": self.namespace, "nameservers": nameservers, "brokers": brokers}


def epoch_ms(value: int | datetime, what: str = "time") -> int:
    """Epoch milliseconds from an int (ms) or a datetime (naive: local time), exactly."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.astimezone()
        return (aware - _EPOCH) // timedelta(milliseconds=1)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidMessageError(f"{what}={value!r}: epoch milliseconds (an int >= 0) or a datetime")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

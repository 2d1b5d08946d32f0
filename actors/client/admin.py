"""Admin operations over a running cluster (RocketMQ's ``mqadmin``): topics, status,
lookups, consumer lag and offset resets. Control plane only; every call here
talks to the NameServers and brokers directly."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from actors.client.admin_base import (
    ADMIN_TIMEOUT_S,
    INDEX_TIME_RESOLUTION_MS,
    RESET_POSITIONS,
    epoch_ms,
)
from actors.client.admin_groups import GroupAdmin
from actors.coordinator.txn import TXN_COORDINATOR_NAME
from actors.protocol import rpc as _rpc
from actors.protocol.checks import check_number
from actors.protocol.errors import PromotionRefusedError
from actors.protocol.names import fleet_actor_name
from storage.errors import (
    BrokerUnavailableError,
)

log = logging.getLogger("raymq.actors.admin")

__all__ = ["ADMIN_TIMEOUT_S", "INDEX_TIME_RESOLUTION_MS", "RESET_POSITIONS", "Admin", "epoch_ms"]


class Admin(GroupAdmin):
    """Admin operations over a running cluster: topics
    (:class:`~actors.client.admin_topics.TopicAdmin`), consumer
    groups (:class:`GroupAdmin`), transactions, high availability and the cluster's
    status (here)."""

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
        transactions it committed alone without the coordinator (``actors.broker.transaction.one_phase``;
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

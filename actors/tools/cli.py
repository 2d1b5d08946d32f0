"""``raymq``: start, inspect and use a RayMQ cluster from the shell.

    raymq up [--config cluster.yaml] [--nameservers 2] [--brokers 2] [--local] [--console] ...
    raymq status | down | topic create|update|delete|list|status | send | consume
    raymq topic create P --type LITE [--quota N] [--ttl-ms MS]   (a parent of lite topics)
    raymq lite describe P | list P [--after NAME] [--limit 100] | status|delete P LITE_TOPIC
    raymq query --key K --topic T [--begin TIME] [--end TIME] | --id ID
    raymq lag --group G      raymq offset reset --group G --topic T --to TIME|earliest|latest
    raymq broker promote BROKER [--id N] [--role SYNC_MASTER] [--force]
    raymq dlq list|resend --group G [--id ID]   (perms: raymq topic update T --perm 6)
    raymq group status GROUP [--log N]           (a consumer group's coordinator)
    raymq console [--port 8280] [--host 127.0.0.1] [--auth TOKEN] | --stop   (the web console)
    raymq bench [--topic T] [--body-size 128] [--producers 1] [--duration 10] [--no-consume]

Every command takes ``--address`` (a Ray cluster; default: ``RAY_ADDRESS`` or
the one running on this machine), ``--namespace`` (default ``raymq``),
``--json`` (machine-readable output; tables otherwise) and ``--verbose`` (Ray's
own log lines, quiet otherwise). Bad arguments exit with code 2, as argparse
does; a command that fails exits with 1. A TIME is ISO-8601
(``2024-05-01T12:00:00``, local time without an offset, or ``...Z`` / ``+02:00``) or
milliseconds since the epoch.

``raymq up --local`` starts a Ray head on this machine (with the ``ray`` of this
Python environment, activated or not) and marks it with the node resource
``raymq_up_local``; ``raymq down`` stops such a Ray once no other namespace has
named actors in it (``--keep-ray`` keeps it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import ray

from actors.client.admin import epoch_ms
from actors.client.pull_consumer import PullStatus
from actors.cluster import Cluster, connect, start_cluster
from actors.config.cluster import BrokerSpec, ClusterConfig
from actors.config.console import DEFAULT_CONSOLE_PORT, ConsoleConfig
from actors.console import stop_console
from actors.protocol.names import DEFAULT_NAMESPACE
from actors.protocol.topic import PERM_READ, PERM_WRITE, TopicConfig, perm_to_string
from actors.tools.bench import BenchSummary, run_bench, summary_dict
from actors.tools.local_ray import ensure_ray, stop_local_ray
from storage import Message
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.tools.cli")


# ------------------------------------------------------------ output
def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else human)


def _message_row(m: Any) -> dict[str, Any]:
    return {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "msg_id": m.msg_id,
        "offset_msg_id": m.offset_msg_id,
        "tags": m.tags or "",
        "keys": " ".join(m.keys),
        "store_timestamp": m.store_timestamp,
        "body": m.body.decode("utf-8", "replace"),
    }


# ------------------------------------------------------------ Ray
def _cluster(args: argparse.Namespace) -> Cluster:
    ensure_ray(args)
    return connect(args.namespace)


# ------------------------------------------------------------ commands
def cmd_up(args: argparse.Namespace) -> int:
    cfg = ClusterConfig.from_file(args.config) if args.config else ClusterConfig()
    changes: dict[str, Any] = {}
    if args.namespace != DEFAULT_NAMESPACE or not args.config:
        changes["namespace"] = args.namespace
    if args.nameservers is not None:
        changes["nameservers"] = args.nameservers
    if args.brokers is not None:
        changes["brokers"] = tuple(
            BrokerSpec(f"broker-{chr(ord('a') + i)}") for i in range(args.brokers)
        )
    broker = dict(cfg.broker)
    if args.flush_disk_type:
        broker["store"] = {**broker.get("store", {}), "flush_disk_type": args.flush_disk_type}
    if args.auto_create is not None:
        broker["auto_create_topic_enable"] = args.auto_create
    elif not args.config:
        broker.setdefault("auto_create_topic_enable", True)  # local quickstart default
    changes["broker"] = broker
    if args.store_root:
        changes["store_root"] = args.store_root
    if args.topic:
        changes["topics"] = cfg.topics + tuple(TopicConfig(t) for t in args.topic)
    cfg = dataclasses.replace(cfg, **changes)
    console = (
        ConsoleConfig(namespace=cfg.namespace, port=args.console_port) if args.console else False
    )
    ensure_ray(args, start_if_missing=True)
    cluster = start_cluster(cfg, console=console)
    status = {
        **cluster.admin.cluster_status(),
        "ray_address": ray.get_runtime_context().gcs_address,
        "console": cluster.console_url(),
    }
    _emit(
        args,
        status,
        f"RayMQ cluster up in namespace {cfg.namespace!r} on the Ray at {status['ray_address']}\n"
        + _status_text(status)
        + (f"\n\nconsole: {status['console']}" if status["console"] else ""),
    )
    return 0


def _status_text(status: dict[str, Any]) -> str:
    ns_rows = [
        {
            "nameserver": n["name"],
            "alive": n["alive"],
            "brokers": ",".join(n.get("brokers", [])) or n.get("error", ""),
        }
        for n in status["nameservers"]
    ]
    rows = []
    for b in status["brokers"]:
        if "error" in b:
            rows.append(
                {"broker": b["broker_name"], "id": b["broker_id"], "role": "?", "addr": b["error"]}
            )
            continue
        rows.append(
            {
                "broker": b["broker_name"],
                "id": b["broker_id"],
                "role": b["role"],
                "addr": b["addr"],
                "node": b["node_id"][:12],
                "disk": f"{100 * b['disk_used_ratio']:.0f}%",
                "commitlog": b["commitlog_max_offset"],
                "topics": b["topics"],
                "put_msgs": b["put_msgs"],
                "store_dir": b["store_dir"],
            }
        )
    return (
        _table(ns_rows, ["nameserver", "alive", "brokers"])
        + "\n\n"
        + _table(
            rows,
            [
                "broker",
                "id",
                "role",
                "addr",
                "node",
                "disk",
                "commitlog",
                "topics",
                "put_msgs",
                "store_dir",
            ],
        )
    )


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    status = cluster.admin.cluster_status()
    status["console"] = cluster.console_url()
    console = f"\n\nconsole: {status['console']}" if status["console"] else ""
    _emit(args, status, _status_text(status) + console)
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    """``console``: start the web console on the head node (or show the running one's URL),
    or stop it."""
    cluster = _cluster(args)
    if args.stop:
        stopped = stop_console(args.namespace)
        _emit(
            args,
            {"namespace": args.namespace, "stopped": stopped},
            "console stopped" if stopped else "no console runs",
        )
        return 0
    config = ConsoleConfig(namespace=args.namespace, host=args.host, port=args.port, auth=args.auth)
    running = cluster.console_url()
    url = running or cluster.start_console(config)
    _emit(
        args,
        {"namespace": args.namespace, "url": url, "already_running": bool(running)},
        f"console {'already runs' if running else 'up'} at {url}"
        + ("" if running or not args.auth else " (sign in with the --auth token)"),
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    names = cluster.actor_names()
    cluster.shutdown()
    if args.keep_ray:
        ray_note = "Ray keeps running (--keep-ray)"
    else:
        ray_note = stop_local_ray(args.namespace)
    _emit(
        args,
        {"namespace": args.namespace, "stopped": names, "ray": ray_note},
        f"stopped {len(names)} actor(s) in namespace {args.namespace!r}: {', '.join(names)}\n"
        + ray_note,
    )
    return 0


def cmd_topic(args: argparse.Namespace) -> int:
    admin = _cluster(args).admin
    if args.topic_cmd == "create" and args.type == "LITE":
        brokers = args.brokers.split(",") if args.brokers else None
        made = admin.create_lite_topic(
            args.name, quota=args.quota, ttl_ms=args.ttl_ms, brokers=brokers
        )
        rows = [{"broker": b, **v} for b, v in sorted(made.items())]
        _emit(
            args,
            {"topic": args.name, "type": "LITE", "brokers": made},
            f"created {args.name} (LITE)\n"
            + _table(rows, ["broker", "quota", "ttl_ms", "lite_topics"]),
        )
    elif args.topic_cmd == "create":
        if args.quota is not None or args.ttl_ms is not None:
            raise RayMQError("--quota and --ttl-ms are for --type LITE")
        brokers = args.brokers.split(",") if args.brokers else None
        tc = admin.create_topic(
            args.name, args.read_queues, args.write_queues, args.perm, brokers=brokers
        )
        _emit(
            args,
            tc.to_dict(),
            f"created {tc.topic_name}: read {tc.read_queue_nums} "
            f"write {tc.write_queue_nums} perm {perm_to_string(tc.perm)}",
        )
    elif args.topic_cmd == "update":
        done = admin.update_topic(
            args.name,
            read_queue_nums=args.read_queues,
            write_queue_nums=args.write_queues,
            perm=args.perm,
        )
        _emit(
            args,
            {b: tc.to_dict() for b, tc in done.items()},
            _table(
                [
                    {
                        "broker": b,
                        "read": tc.read_queue_nums,
                        "write": tc.write_queue_nums,
                        "perm": perm_to_string(tc.perm),
                    }
                    for b, tc in sorted(done.items())
                ],
                ["broker", "read", "write", "perm"],
            ),
        )
    elif args.topic_cmd == "delete":
        brokers = admin.delete_topic(args.name)
        _emit(
            args, {"topic": args.name, "deleted_on": brokers}, f"deleted {args.name} on {brokers}"
        )
    elif args.topic_cmd == "list":
        topics = admin.list_topics(include_system=args.all)
        _emit(args, topics, "\n".join(topics) or "(no topics)")
    else:
        rows = admin.topic_status(args.name)
        _emit(
            args,
            rows,
            _table(rows, ["broker", "queue_id", "min_offset", "max_offset", "last_update_ms"]),
        )
    return 0


def cmd_lite(args: argparse.Namespace) -> int:
    """``lite``: the lite topics of a parent of type LITE."""
    admin = _cluster(args).admin
    if args.lite_cmd == "describe":
        d = admin.describe_lite_topic(args.parent)
        rows = [{"broker": b, **v} for b, v in d["brokers"].items()]
        _emit(
            args,
            d,
            f"{args.parent} (LITE): {d['lite_topics']} lite topics, quota {d['quota']} "
            f"({d['quota_used']:.1%} used), ttl {d['ttl_ms']} ms\n"
            + _table(rows, ["broker", "quota", "ttl_ms", "lite_topics"]),
        )
    elif args.lite_cmd == "list":
        page = admin.list_lite_topics(args.parent, args.after, args.limit)
        more = f"\n(next page: --after {page['next']})" if page["next"] is not None else ""
        _emit(
            args,
            page,
            "\n".join(page["lite_topics"] or ["(none)"])
            + f"\n({len(page['lite_topics'])} of {page['total']}){more}",
        )
    elif args.lite_cmd == "status":
        st = admin.lite_topic_status(args.parent, args.lite_topic)
        rows = [{"group": g, **v} for g, v in st["groups"].items()]
        _emit(
            args,
            st,
            f"{args.parent}/{args.lite_topic} on {st['broker']}: offsets "
            f"{st['min_offset']}..{st['max_offset']}, last write {st['last_write_ms']}\n"
            + _table(rows, ["group", "committed_offset", "lag", "owner"]),
        )
    else:
        brokers = admin.delete_lite_topic(args.parent, args.lite_topic)
        _emit(
            args,
            {"parent": args.parent, "lite_topic": args.lite_topic, "deleted_on": brokers},
            f"deleted lite topic {args.lite_topic} of {args.parent} on {brokers}",
        )
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    if args.body is not None:
        bodies = [args.body.encode()] * args.count
    elif args.file:
        with open(args.file, "rb") as fh:
            bodies = [fh.read()] * args.count
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer if line.strip()]
    keys = args.keys.split(",") if args.keys else ()
    msgs = [Message(args.topic, body, tags=args.tags, keys=keys) for body in bodies]
    producer = _cluster(args).producer(args.group)
    results = list(producer.send_batch(msgs, sharding_key=args.sharding_key))
    producer.close()
    rows = [
        {
            "msg_id": r.msg_id,
            "offset_msg_id": r.offset_msg_id,
            "status": r.status.value,
            "broker": r.message_queue.broker_name,
            "queue_id": r.message_queue.queue_id,
            "queue_offset": r.queue_offset,
        }
        for r in results
    ]
    _emit(args, rows, _table(rows, ["msg_id", "status", "broker", "queue_id", "queue_offset"]))
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    consumer = _cluster(args).pull_consumer(args.group)
    queues = consumer.fetch_subscribe_queues(args.topic)
    offsets = {}
    for q in queues:
        committed = consumer.fetch_offset(q) if args.start == "committed" else -1
        offsets[q] = (
            committed
            if committed >= 0
            else (consumer.max_offset(q) if args.start == "latest" else consumer.min_offset(q))
        )
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.wait
    active = dict(offsets)
    while active and len(rows) < args.max:
        results = consumer.pull_many(
            list(active.items()), min(args.max - len(rows), 1024), tags=args.tags, long_poll_s=0.0
        )
        progressed = False
        for r in results:
            if r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                rows.extend(_message_row(m) for m in r.messages)
                offsets[r.queue] = active[r.queue] = r.next_offset
                progressed = True
            elif r.status is PullStatus.OFFSET_ILLEGAL:
                offsets[r.queue] = active[r.queue] = r.next_offset
        if not progressed:
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    rows = rows[: args.max]
    if args.commit:
        consumer.commit_offsets(offsets)
    _emit(args, rows, _table(rows, ["queue_id", "queue_offset", "tags", "keys", "msg_id", "body"]))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    admin = _cluster(args).admin
    if args.key is not None:
        if not args.topic:
            raise RayMQError("query --key needs --topic")
        found = admin.query_by_key(
            args.topic,
            args.key,
            args.max,
            _parse_time(args.begin, "--begin") if args.begin else None,
            _parse_time(args.end, "--end") if args.end else None,
        )
    elif args.begin or args.end:
        raise RayMQError("query --begin/--end go with --key (an id names one message)")
    else:
        found = [admin.query_by_id(args.id, args.topic)]
    rows = [_message_row(m) for m in found]
    _emit(
        args,
        rows,
        _table(rows, ["topic", "queue_id", "queue_offset", "tags", "keys", "msg_id", "body"]),
    )
    return 0


def cmd_lag(args: argparse.Namespace) -> int:
    rows = _cluster(args).admin.consumer_lag(args.group, args.topic)
    total = sum(r["lag"] for r in rows)
    _emit(
        args,
        {"group": args.group, "total_lag": total, "queues": rows},
        _table(rows, ["topic", "broker", "queue_id", "broker_offset", "consumer_offset", "lag"])
        + f"\ntotal lag: {total}",
    )
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    admin = _cluster(args).admin
    if args.dlq_cmd == "list":
        rows = [
            {
                **_message_row(m),
                "origin_topic": m.properties.get("RETRY_TOPIC", ""),
                "reconsume_times": m.reconsume_times,
            }
            for m in admin.dlq_messages(args.group, args.max)
        ]
        _emit(
            args,
            rows,
            _table(rows, ["msg_id", "origin_topic", "reconsume_times", "tags", "keys", "body"]),
        )
    else:
        results = admin.resend_dlq(args.group, args.id or None)
        rows = [
            {
                "msg_id": r.msg_id,
                "topic": r.message_queue.topic,
                "broker": r.message_queue.broker_name,
                "queue_id": r.message_queue.queue_id,
                "status": r.status.value,
            }
            for r in results
        ]
        _emit(args, rows, _table(rows, ["msg_id", "topic", "broker", "queue_id", "status"]))
    return 0


def cmd_txn(args: argparse.Namespace) -> int:
    """``txn list``: half messages waiting for their producer's commit or rollback."""
    rows = _cluster(args).admin.pending_transactions(args.group)
    for r in rows:
        r["age_s"] = round(r["age_s"], 1)
    columns = ["broker", "msg_id", "group", "topic", "age_s", "check_times"]
    _emit(args, rows, _table(rows, columns) + f"\npending: {len(rows)}")
    return 0


def cmd_txn_coordinator(args: argparse.Namespace) -> int:
    """``txn coordinator``: the transaction coordinator's producers, undone decisions
    and counters."""
    status = _cluster(args).admin.transaction_coordinator()
    if status is None:
        _emit(
            args,
            None,
            "no transaction coordinator runs (the first TransactionalProducer starts it)",
        )
        return 0
    producers = [
        {"transactional_id": tid, "producer_id": pid, "epoch": epoch}
        for tid, (pid, epoch) in sorted(status["producers"].items())
    ]
    data = {k: status[k] for k in ("log", "pending", "recovered", "stats", "one_phase")}
    data["producers"] = producers
    counters = ", ".join(f"{k} {v}" for k, v in sorted(status["stats"].items())) or "none yet"
    alone = ", ".join(f"{b} {n}" for b, n in sorted(status["one_phase"].items())) or "no broker"
    human = (
        _table(producers, ["transactional_id", "producer_id", "epoch"])
        + f"\nlog: {status['log']}"
        + f"\ndecisions not applied everywhere yet: {len(status['pending'])}"
        + "".join(f"\n  {t}" for t in status["pending"])
        + f"\ncounters: {counters}"
        + f"\ncommitted by one broker alone (one-phase): {alone}"
    )
    _emit(args, data, human)
    return 0


def _queue_name(q: Any) -> str:
    return f"{q.topic}:{q.broker_name}:{q.queue_id}"


def cmd_group(args: argparse.Namespace) -> int:
    """``group status``: members, owners and the recent generation log of a group."""
    status = _cluster(args).admin.group_status(args.group)
    members = [
        {"client_id": cid, "queues": len(m["owned"]), "room": m["room"] or "", **m}
        for cid, m in status["members"].items()
    ]
    owners = [
        {
            "queue": _queue_name(q),
            "owner": owner,
            "token": f"{token[0]}/{token[1]}",
            "target": status["target"].get(q, ""),
        }
        for q, (owner, token) in sorted(status["assignment"].items())
    ]
    log_rows = [
        {
            "t": round(ev.time, 3),
            "generation": ev.generation,
            "event": ev.event,
            "queue": _queue_name(ev.queue) if ev.queue is not None else "",
            "from": ev.from_id or "",
            "to": ev.to_id or "",
        }
        for ev in status["log"][-args.log :]
    ]
    data = {
        "group": args.group,
        "generation": status["generation"],
        "strategy": status["strategy"],
        "members": status["members"],
        "assignment": owners,
        "pending_revokes": {_queue_name(q): v for q, v in status["pending_revokes"].items()},
        "log": log_rows,
    }
    human = (
        f"group {args.group}: generation {status['generation']}, strategy {status['strategy']}\n"
        + _table(members, ["client_id", "queues", "room", "session_timeout_s", "last_seen_age_s"])
        + "\n\n"
        + _table(owners, ["queue", "owner", "token", "target"])
        + f"\n\npending revokes: {len(status['pending_revokes'])}\n"
        + _table(log_rows, ["t", "generation", "event", "queue", "from", "to"])
    )
    _emit(args, data, human)
    return 0


def _parse_time(text: str, what: str) -> int:
    """A TIME argument (ISO-8601, or epoch milliseconds) as epoch milliseconds."""
    if text.isdigit():
        return int(text)
    try:
        utc = text.endswith(("Z", "z"))  # Python 3.10's fromisoformat does not read it
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if utc else text)
    except ValueError:
        raise ValueError(
            f"{what} {text!r}: a time as ISO-8601 (2024-05-01T12:00:00, local time unless it "
            "ends in Z or an offset such as +02:00) or as milliseconds since the epoch"
        ) from None
    return epoch_ms(moment, what)


def cmd_offset(args: argparse.Namespace) -> int:
    """``offset reset``: move a group's offsets on a topic to a time, the earliest or the
    latest message; its running consumers go on from there."""
    to: int | str = args.to if args.to in ("earliest", "latest") else _parse_time(args.to, "--to")
    done = _cluster(args).admin.reset_offset(args.group, args.topic, to)
    rows = [
        {"topic": mq.topic, "broker": mq.broker_name, "queue_id": mq.queue_id, "offset": off}
        for mq, off in sorted(done.items())
    ]
    _emit(
        args,
        {"group": args.group, "topic": args.topic, "to": to, "queues": rows},
        f"group {args.group} reset on {args.topic} to {args.to}\n"
        + _table(rows, ["topic", "broker", "queue_id", "offset"]),
    )
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    """``broker promote``: a slave of a group whose master is gone becomes its master."""
    done = _cluster(args).admin.promote(
        args.broker_name,
        args.id,
        role=args.role,
        force=args.force,
        status_timeout_s=args.status_timeout,
    )
    _emit(
        args,
        done,
        f"{done['broker']} is now {done['role']} of {args.broker_name} "
        f"(epoch {done['epoch']}, commitlog offset {done['commitlog_offset']})",
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """RocketMQ's benchmark: a line per second while it runs, then a summary."""
    for option in ("duration", "producers", "body_size", "batch", "queues"):
        if getattr(args, option) <= 0:
            raise ValueError(f"--{option.replace('_', '-')}={getattr(args, option)}: must be > 0")
    cluster = _cluster(args)
    admin = cluster.admin
    if args.topic not in admin.list_topics(include_system=True):
        admin.create_topic(args.topic, args.queues, args.queues)
        if not args.json:
            print(f"created topic {args.topic} ({args.queues} queues)", file=sys.stderr)
    live = None if args.json else (lambda line: print(line, flush=True))
    summary = run_bench(
        cluster,
        args.topic,
        seconds=args.duration,
        producers=args.producers,
        body_size=args.body_size,
        batch=args.batch,
        consume=args.consume,
        report=live,
    )
    settings = {
        "topic": args.topic,
        "body_size": args.body_size,
        "producers": args.producers,
        "batch": args.batch,
        "consume": args.consume,
    }
    _emit(args, {**settings, **summary_dict(summary)}, _bench_summary_text(summary, args.consume))
    return 0


def _bench_summary_text(s: BenchSummary, consume: bool) -> str:
    return (
        f"Summary: {s.seconds:.1f} s, sent {s.sent:,} (failed {s.failed:,})"
        + (f", consumed {s.consumed:,}" if consume else "")
        + f"\nSend TPS: {s.send_tps:,.0f}  Max RT(ms): {s.max_rt_ms:.1f}  "
        f"Average RT(ms): {s.avg_rt_ms:.2f}  Send Failed: {s.failed}"
        + (f"  Consume TPS: {s.consume_tps:,.0f}" if consume else "")
    )


# ------------------------------------------------------------ parser
_T = TypeVar("_T")


def _converted(text: str, kind: Callable[[str], _T], noun: str) -> _T:
    """``text`` as ``kind``; an ``ArgumentTypeError`` naming ``noun`` if it is not one."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None


def _count(text: str) -> int:
    """An argument that counts something: an int >= 1."""
    value = _converted(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    """A duration: a number >= 0."""
    value = _converted(text, float, "a number")
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _port(text: str) -> int:
    """A TCP port: 0..65535 (0: any free port)."""
    value = _converted(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def _name(text: str) -> str:
    """A group, topic or broker name: not empty, no blanks."""
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a non-empty name without blanks")
    return text


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", default=argparse.SUPPRESS, help="Ray cluster address")
    common.add_argument(
        "--namespace", type=_name, default=argparse.SUPPRESS, help="Ray namespace of the cluster"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    common.add_argument(
        "--verbose", action="store_true", default=argparse.SUPPRESS, help="Ray's own log lines too"
    )
    p = argparse.ArgumentParser(prog="raymq", description="RayMQ: RocketMQ on Ray")
    p.add_argument("--address", default=None)
    p.add_argument("--namespace", type=_name, default=DEFAULT_NAMESPACE)
    p.add_argument("--json", action="store_true", default=False)
    p.add_argument("--verbose", action="store_true", default=False)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser(
        "up", parents=[common], help="start a cluster (and a local Ray if none runs)"
    )
    up.add_argument("--config", help="cluster YAML or TOML file")
    up.add_argument("--nameservers", type=_count)
    up.add_argument("--brokers", type=_count)
    up.add_argument("--store-root")
    up.add_argument("--flush-disk-type", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    up.add_argument("--auto-create", dest="auto_create", action="store_true", default=None)
    up.add_argument("--no-auto-create", dest="auto_create", action="store_false")
    up.add_argument("--topic", action="append", help="create this topic (repeatable)")
    up.add_argument("--local", action="store_true", help="start a new local Ray even if one runs")
    up.add_argument("--num-cpus", type=_count, help="CPUs of a local Ray this command starts")
    up.add_argument("--ray-temp-dir", help="--temp-dir of a local Ray this command starts")
    up.add_argument("--console", action="store_true", help="start the web console too")
    up.add_argument(
        "--console-port", type=_port, default=DEFAULT_CONSOLE_PORT, help="with --console"
    )
    up.set_defaults(fn=cmd_up)

    sub.add_parser("status", parents=[common], help="NameServers and brokers").set_defaults(
        fn=cmd_status
    )
    down = sub.add_parser(
        "down", parents=[common], help="stop the cluster's actors (Ray keeps running)"
    )
    down.add_argument(
        "--keep-ray",
        action="store_true",
        help="keep the local Ray that raymq up --local started (stopped by default)",
    )
    down.set_defaults(fn=cmd_down)

    topic = sub.add_parser("topic", help="create, update, delete, list, status")
    tsub = topic.add_subparsers(dest="topic_cmd", required=True)
    for name in ("create", "update"):
        t = tsub.add_parser(name, parents=[common])
        t.add_argument("name", type=_name)
        default = 8 if name == "create" else None
        t.add_argument("--read-queues", type=int, default=default)
        t.add_argument("--write-queues", type=int, default=default)
        t.add_argument(
            "--perm",
            type=int,
            default=PERM_READ | PERM_WRITE if name == "create" else None,
            help="2 write, 4 read, 6 both",
        )
        if name == "create":
            t.add_argument("--brokers", help="comma-separated broker names (default: all)")
            t.add_argument(
                "--type",
                choices=["NORMAL", "LITE"],
                default="NORMAL",
                help="LITE: a parent of lite topics",
            )
            t.add_argument("--quota", type=_count, help="LITE: live lite topics per broker at most")
            t.add_argument(
                "--ttl-ms", type=_count, help="LITE: a lite topic's life after its last write"
            )
        t.set_defaults(fn=cmd_topic)
    t = tsub.add_parser("delete", parents=[common])
    t.add_argument("name", type=_name)
    t.set_defaults(fn=cmd_topic)
    t = tsub.add_parser("list", parents=[common])
    t.add_argument("--all", action="store_true", help="include system topics")
    t.set_defaults(fn=cmd_topic)
    t = tsub.add_parser("status", parents=[common])
    t.add_argument("name", type=_name)
    t.set_defaults(fn=cmd_topic)

    lite = sub.add_parser("lite", help="lite topics of a LITE parent: describe, list, ...")
    lsub = lite.add_subparsers(dest="lite_cmd", required=True)
    x = lsub.add_parser("describe", parents=[common], help="quota, TTL, lite topics")
    x.add_argument("parent", type=_name)
    x.set_defaults(fn=cmd_lite)
    x = lsub.add_parser("list", parents=[common], help="a page of lite topics by name")
    x.add_argument("parent", type=_name)
    x.add_argument("--after", default="", help="the last name of the page before")
    x.add_argument("--limit", type=_count, default=100, help="names per page")
    x.set_defaults(fn=cmd_lite)
    for cmd, what in (("status", "offsets, groups' offsets and lag"), ("delete", "delete now")):
        x = lsub.add_parser(cmd, parents=[common], help=what)
        x.add_argument("parent", type=_name)
        x.add_argument("lite_topic", type=_name)
        x.set_defaults(fn=cmd_lite)

    send = sub.add_parser(
        "send", parents=[common], help="send messages (body, file or stdin lines)"
    )
    send.add_argument("topic", type=_name)
    send.add_argument("--body")
    send.add_argument("--file")
    send.add_argument("--count", type=_count, default=1)
    send.add_argument("--tags")
    send.add_argument("--keys", help="comma-separated keys")
    send.add_argument("--sharding-key")
    send.add_argument("--group", type=_name, default="raymq-cli-producer")
    send.set_defaults(fn=cmd_send)

    consume = sub.add_parser("consume", parents=[common], help="pull messages of a topic")
    consume.add_argument("topic", type=_name)
    consume.add_argument("--group", type=_name, default="raymq-cli-consumer")
    consume.add_argument("--tags")
    consume.add_argument("--max", type=_count, default=100)
    consume.add_argument(
        "--start", choices=["committed", "earliest", "latest"], default="committed"
    )
    consume.add_argument(
        "--wait", type=_seconds, default=0.0, help="seconds to wait for new messages"
    )
    consume.add_argument("--no-commit", dest="commit", action="store_false")
    consume.set_defaults(fn=cmd_consume)

    query = sub.add_parser("query", parents=[common], help="find messages by key or id")
    which = query.add_mutually_exclusive_group(required=True)
    which.add_argument("--key")
    which.add_argument("--id")
    query.add_argument("--topic", type=_name)
    query.add_argument("--max", type=_count, default=32)
    query.add_argument("--begin", help="with --key: stored at or after TIME")
    query.add_argument("--end", help="with --key: stored at or before TIME")
    query.set_defaults(fn=cmd_query)

    lag = sub.add_parser("lag", parents=[common], help="consumer lag of a group")
    lag.add_argument("--group", type=_name, required=True)
    lag.add_argument("--topic", type=_name)
    lag.set_defaults(fn=cmd_lag)

    broker = sub.add_parser("broker", help="broker groups: promote a slave")
    bsub = broker.add_subparsers(dest="broker_cmd", required=True)
    b = bsub.add_parser(
        "promote",
        parents=[common],
        help="make a slave the master of a group whose master is gone",
    )
    b.add_argument("broker_name", type=_name)
    b.add_argument("--id", type=int, help="the slave's broker id (default: the most complete)")
    b.add_argument("--role", choices=["ASYNC_MASTER", "SYNC_MASTER"])
    b.add_argument(
        "--force",
        action="store_true",
        help="even if the master looks alive, a slave is ahead, or one does not answer",
    )
    b.add_argument(
        "--status-timeout",
        type=float,
        default=10.0,
        help="seconds each slave has to say how much it holds (default 10)",
    )
    b.set_defaults(fn=cmd_broker)

    dlq = sub.add_parser("dlq", help="dead letters of a consumer group: list, resend")
    dsub = dlq.add_subparsers(dest="dlq_cmd", required=True)
    d = dsub.add_parser("list", parents=[common], help="messages in %%DLQ%%<group>")
    d.add_argument("--group", type=_name, required=True)
    d.add_argument("--max", type=_count, default=100)
    d.set_defaults(fn=cmd_dlq)
    d = dsub.add_parser("resend", parents=[common], help="send dead letters to their topic")
    d.add_argument("--group", type=_name, required=True)
    d.add_argument("--id", action="append", help="only this message id (repeatable)")
    d.set_defaults(fn=cmd_dlq)

    txn = sub.add_parser(
        "txn", help="transactional messages: what waits for an end, the coordinator's view"
    )
    xsub = txn.add_subparsers(dest="txn_cmd", required=True)
    x = xsub.add_parser(
        "list", parents=[common], help="pending half messages with age and check count"
    )
    x.add_argument("--group", type=_name, help="only this producer group")
    x.set_defaults(fn=cmd_txn)
    x = xsub.add_parser(
        "coordinator",
        parents=[common],
        help="multi-message transactions: producers and epochs, undone decisions, counters",
    )
    x.set_defaults(fn=cmd_txn_coordinator)

    grp = sub.add_parser("group", help="consumer groups: their coordinator's view")
    gsub = grp.add_subparsers(dest="group_cmd", required=True)
    g = gsub.add_parser("status", parents=[common], help="members, owners, generation log")
    g.add_argument("group", type=_name)
    g.add_argument("--log", type=_count, default=20, help="last N events of the generation log")
    g.set_defaults(fn=cmd_group)

    offset = sub.add_parser("offset", help="a consumer group's committed offsets")
    osub = offset.add_subparsers(dest="offset_cmd", required=True)
    o = osub.add_parser(
        "reset",
        parents=[common],
        help="move a group on a topic to a time, earliest or latest; its consumers follow",
    )
    o.add_argument("--group", type=_name, required=True)
    o.add_argument("--topic", type=_name, required=True)
    o.add_argument("--to", required=True, help="TIME (ISO-8601 or epoch ms), earliest or latest")
    o.set_defaults(fn=cmd_offset)

    con = sub.add_parser(
        "console", parents=[common], help="the web console: start it (or show its URL), stop it"
    )
    con.add_argument("--port", type=_port, default=DEFAULT_CONSOLE_PORT, help="0: any free port")
    con.add_argument("--host", default="127.0.0.1", help="another address needs --auth")
    con.add_argument(
        "--auth",
        default=os.environ.get("RAYMQ_CONSOLE_AUTH"),
        help="token (8+ characters) a browser signs in with (default: $RAYMQ_CONSOLE_AUTH)",
    )
    con.add_argument("--stop", action="store_true", help="stop the running console")
    con.set_defaults(fn=cmd_console)

    bench = sub.add_parser(
        "bench", parents=[common], help="producer/consumer benchmark against the cluster"
    )
    bench.add_argument("--topic", default="BenchmarkTest", help="created if absent")
    bench.add_argument("--queues", type=int, default=8, help="queues of a topic it creates")
    bench.add_argument("--body-size", type=int, default=128, help="bytes per message")
    bench.add_argument("--producers", type=int, default=1, help="producer threads")
    bench.add_argument("--duration", type=float, default=10.0, help="seconds to run")
    bench.add_argument("--batch", type=int, default=32, help="messages per send")
    bench.add_argument("--consume", action=argparse.BooleanOptionalAction, default=True)
    bench.set_defaults(fn=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.fn(args)
    except (RayMQError, ValueError, OSError) as exc:
        if args.json:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        else:
            print(f"raymq: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""The consumer-group coordinator on a real 2-broker cluster: generations and the
strategy's assignment, revoke before reassign, fencing a member that does not give a
queue up (its stale commit is refused), a dead member dropped at once, push
consumers scaling 1 -> 4 -> 2 -> 3 under load with every queue owned at most once,
and the coordinator host: groups that share it stay apart, and its death is survived
by every group in it."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from raymq_testkit import SMALL_STORE, printed_json, stored_ends, unique_namespace, wait_until

import actors
from actors import (
    ConsumeStatus,
    CoordinatorConfig,
    OffsetFencedError,
    PushConsumer,
    coordinator_actor_name,
    coordinator_for,
)
from actors.coordinator.host import (
    CoordinatorHandle,
    coordinated_groups,
    find_coordinator,
)
from actors.protocol.rpc import get
from actors.tools.cli import main
from rebalance import MessageQueue, assign, get_strategy
from storage import Message
from storage.errors import InvalidConfigError, RayMQError

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actor classes below

FAST = {
    "heartbeat_interval_s": 0.3,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_s": 2.0,
    "pull_retry_delay_s": 0.2,
    "consume_from": "FIRST",
    "consume_threads": 4,
    "consume_batch_size": 32,
    "pull_batch_size": 64,
}
SHORT = CoordinatorConfig(revoke_timeout_s=1.5, route_refresh_s=2.0, fence_timeout_s=2.0)
LONG_SESSION = 120.0  # hand-driven members must not expire while a test looks at them


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[actors.Cluster]:
    c = actors.start_cluster(
        namespace=unique_namespace("coord"),
        nameservers=1,
        brokers=2,
        store_root=str(tmp_path_factory.mktemp("coord")),
        broker_options={"store": SMALL_STORE, "heartbeat_interval_s": 2.0},
    )
    yield c
    c.shutdown()


def queues_of(cluster: actors.Cluster, topic: str) -> list[MessageQueue]:
    return sorted(
        MessageQueue(topic, r["broker"], r["queue_id"]) for r in cluster.admin.topic_status(topic)
    )


def status(coord: Any) -> dict[str, Any]:
    return get(coord.status.remote(), 30)


def join(coord: Any, cid: str, topic: str, **kw: Any) -> Any:
    return get(coord.join.remote(cid, [topic], session_timeout_s=LONG_SESSION, **kw), 30)


def view(coord: Any, cid: str) -> Any:
    return get(coord.view.remote(cid), 30)


def confirm_all(coord: Any, cids: list[str]) -> None:
    """Play well-behaved members: confirm every revoke until the group is settled."""

    def settled() -> bool:
        for cid in cids:
            v = view(coord, cid)
            if v.revoke:
                get(coord.confirm.remote(cid, list(v.revoke)), 30)
        s = status(coord)
        return (
            not s["pending_revokes"]
            and not s["pending_fences"]
            and {q: o for q, (o, _) in s["assignment"].items()} == s["target"]
        )

    wait_until(settled, timeout_s=20, what="a settled group")


def owners_one_at_a_time(log: list[Any]) -> dict[MessageQueue, str]:
    """Replay the generation log: a queue is assigned only while nobody owns it, and
    only its owner confirms or is fenced off it. Returns the final owners."""
    owner: dict[MessageQueue, str] = {}
    for ev in log:
        if ev.event == "assign":
            assert ev.queue not in owner, f"{ev}: {ev.queue} still owned by {owner[ev.queue]}"
            owner[ev.queue] = ev.to_id
        elif ev.event in ("confirm", "fence"):
            assert owner.get(ev.queue) == ev.from_id, f"{ev}: owner is {owner.get(ev.queue)}"
            del owner[ev.queue]
    return owner


# ---------------------------------------------------------------------- the coordinator alone
def test_join_and_leave_make_generations_and_the_strategy_s_assignment(
    cluster: actors.Cluster,
) -> None:
    topic, group = "CoordAssign", "g-assign"
    cluster.admin.create_topic(topic, 4, 4)
    queues = queues_of(cluster, topic)
    coord = coordinator_for(group, cluster.namespace, config=SHORT)
    assert ray.get_actor(coordinator_actor_name(group), namespace=cluster.namespace)

    first = join(coord, "c-a", topic)
    assert sorted(first.owned) == queues and not first.revoke  # alone: everything, at once
    gen = [first.generation]
    for cid in ("c-b", "c-c"):
        join(coord, cid, topic)
        confirm_all(coord, ["c-a", "c-b", "c-c"])
        gen.append(status(coord)["generation"])
    expected = assign("averagely", group, queues, ["c-a", "c-b", "c-c"])
    assert {cid: sorted(view(coord, cid).owned) for cid in expected} == expected
    assert gen == sorted(set(gen)), "every join is a new generation"
    tokens = [tok for cid in expected for tok in view(coord, cid).owned.values()]
    assert all(epoch == tokens[0][0] for epoch, _ in tokens)

    v = view(coord, "c-b")
    assert get(coord.leave.remote("c-b", list(v.owned)), 30)  # committed: handed on at once
    s = status(coord)
    assert s["generation"] > gen[-1] and sorted(s["members"]) == ["c-a", "c-c"]
    expected = assign("averagely", group, queues, ["c-a", "c-c"])
    confirm_all(coord, ["c-a", "c-c"])
    assert {cid: sorted(view(coord, cid).owned) for cid in expected} == expected
    assert not view(coord, "c-b").member
    owners_one_at_a_time(status(coord)["log"])

    with pytest.raises(InvalidConfigError, match="strategy"):
        join(coord, "c-d", topic, strategy="consistent_hash")
    with pytest.raises(InvalidConfigError, match="needs option.*queues"):
        join(coordinator_for("g-config", cluster.namespace), "x", topic, strategy="config")

    ring = coordinator_for("g-ring", cluster.namespace, config=SHORT)
    opts = {"virtual_nodes": 7}
    members = ["r-1", "r-2", "r-3"]
    for cid in members:
        join(ring, cid, topic, strategy="consistent_hash", strategy_options=opts)
        confirm_all(ring, members)
    expected = assign(get_strategy("consistent_hash", **opts), "g-ring", queues, members)
    assert {cid: sorted(view(ring, cid).owned) for cid in members} == expected
    with pytest.raises(InvalidConfigError, match="consistent_hash"):
        join(ring, "r-4", topic, strategy="consistent_hash", strategy_options={"virtual_nodes": 3})


def test_a_coordinator_logs_no_false_warning_of_a_blocking_get(cluster: actors.Cluster) -> None:
    """Its NameServer calls block in an executor thread, never on its event loop: Ray's
    warning of a ``ray.get`` in an async actor is false for it and is not printed."""
    topic = "CoordQuiet"
    cluster.admin.create_topic(topic, 2, 2)
    coord = coordinator_for("g-quiet", cluster.namespace, config=SHORT)
    assert sorted(join(coord, "q-a", topic).owned) == queues_of(cluster, topic)  # routes read
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    mine = [
        text
        for path in logs.glob("worker-*.err")
        if ":actor_name:CoordinatorHost\n" in (text := path.read_text(errors="replace"))
    ]
    assert mine, "the coordinators' own logs"
    assert not [text for text in mine if "blocking ray.get" in text]


def test_a_queue_moves_only_after_its_owner_confirms_the_revoke(
    cluster: actors.Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = "CoordRevoke", "g-revoke"
    cluster.admin.create_topic(topic, 2, 2)
    coord = coordinator_for(group, cluster.namespace, config=CoordinatorConfig(revoke_timeout_s=60))
    join(coord, "a", topic)
    join(coord, "b", topic)
    revoked = view(coord, "a").revoke
    assert len(revoked) == 2 and not view(coord, "b").owned  # b waits for a
    moved = sorted(revoked)[0]
    get(coord.confirm.remote("a", [moved]), 30)
    assert sorted(view(coord, "b").owned) == [moved]
    assert moved not in view(coord, "a").owned and moved not in view(coord, "a").revoke
    log = status(coord)["log"]
    events = [(ev.event, ev.from_id, ev.to_id) for ev in log if ev.queue == moved]
    assert events[-3:] == [("revoke", "a", "b"), ("confirm", "a", None), ("assign", None, "b")]
    # the new owner's token is newer than the old one's
    assert view(coord, "b").owned[moved] > revoked[moved]
    owners_one_at_a_time(log)

    assert main(["group", "status", group, "--namespace", cluster.namespace, "--json"]) == 0
    shown = printed_json(capsys.readouterr().out)
    assert shown["generation"] == status(coord)["generation"]
    assert {row["owner"] for row in shown["assignment"]} == {"a", "b"}
    assert len(shown["pending_revokes"]) == 1 and shown["log"][-1]["event"] == "assign"


def test_a_member_that_never_confirms_is_fenced_and_its_stale_commit_refused(
    cluster: actors.Cluster,
) -> None:
    topic, group = "CoordFence", "g-fence"
    cluster.admin.create_topic(topic, 2, 2, brokers=["broker-a"])
    producer = cluster.producer("p-fence", max_batch_messages=10)
    producer.send_batch([Message(topic, b"m%d" % i) for i in range(20)])  # 10 per queue
    producer.close()
    broker = cluster.broker("broker-a")
    coord = coordinator_for(group, cluster.namespace, config=SHORT)
    a = join(coord, "a", topic)
    q0, q1 = sorted(a.owned)
    key0, key1 = (topic, q0.queue_id), (topic, q1.queue_id)
    a_tokens = {key0: a.owned[q0], key1: a.owned[q1]}
    assert get(broker.commit_offsets.remote(group, {key0: 2, key1: 2}, "a", a_tokens), 30) == 2

    join(coord, "b", topic)  # takes one of a's queues; a never confirms
    taken = wait_until(lambda: view(coord, "b").owned, timeout_s=10, what="the fenced queue")
    (lost,) = taken
    kept = q1 if lost == q0 else q0
    s = status(coord)
    assert [ev.from_id for ev in s["log"] if ev.event == "fence"] == ["a"]
    assert s["fences"][lost] == taken[lost]
    assert sorted(view(coord, "a").owned) == [kept]  # the view tells a it lost the queue

    # a's commit naming the lost queue is refused whole: not even its own queue moves
    with pytest.raises(OffsetFencedError, match="no longer owns"):
        get(broker.commit_offsets.remote(group, {key0: 5, key1: 5}, "a", a_tokens), 30)
    assert get(broker.query_offsets.remote(group, topic), 30) == {q0.queue_id: 2, q1.queue_id: 2}
    lost_key = (topic, lost.queue_id)
    b_tok = {lost_key: taken[lost]}
    assert get(broker.commit_offsets.remote(group, {lost_key: 7}, "b", b_tok), 30) == 1
    assert get(broker.commit_offsets.remote(group, {lost_key: 8}, "admin"), 30) == 1  # no token
    assert get(broker.query_offset.remote(group, topic, lost.queue_id), 30) == 8
    owners_one_at_a_time(s["log"])


@ray.remote(num_cpus=0, max_concurrency=4)
class Sentinel:
    """An actor a member lives in; the coordinator watches its ``wait_closed``."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def wait_closed(self) -> None:
        self.closed.wait()

    def ping(self) -> bool:
        return True


def test_a_dead_actor_member_is_dropped_at_once(cluster: actors.Cluster) -> None:
    topic, group = "CoordDead", "g-dead"
    cluster.admin.create_topic(topic, 2, 2)
    coord = coordinator_for(group, cluster.namespace, config=SHORT)
    host = Sentinel.remote()
    ray.get(host.ping.remote())
    with pytest.raises(InvalidConfigError, match="wait_closed"):
        join(coord, "nowatch", topic, actor_handle=coord)  # a coordinator has no wait_closed
    join(coord, "survivor", topic)
    join(coord, "hosted", topic, actor_handle=host)
    confirm_all(coord, ["survivor", "hosted"])
    assert status(coord)["members"]["hosted"]["watched"]
    killed = time.monotonic()
    ray.kill(host, no_restart=True)
    wait_until(lambda: "hosted" not in status(coord)["members"], timeout_s=10, what="the drop")
    dropped_after = time.monotonic() - killed
    assert dropped_after < LONG_SESSION / 10  # Ray's word, not the session timeout
    wait_until(lambda: len(view(coord, "survivor").owned) == 4, what="the takeover")
    log = status(coord)["log"]
    hosted = [ev.event for ev in log if ev.from_id == "hosted"]
    assert hosted[-3:] == ["dead", "fence", "fence"]  # its two queues, fenced before they moved
    owners_one_at_a_time(log)
    # a join the dead member sent before it died, arriving late, does not bring it back
    with pytest.raises(InvalidConfigError, match="cannot rejoin"):
        join(coord, "hosted", topic, actor_handle=host)
    assert "hosted" not in status(coord)["members"]
    assert status(coord)["gone_tracked"] == 1


def test_a_dead_member_s_id_is_forgotten_after_forget_gone_s(cluster: actors.Cluster) -> None:
    """A group whose members come and go keeps no trace of each one for ever."""
    topic, group = "CoordForget", "g-forget"
    cluster.admin.create_topic(topic, 2, 2)
    with pytest.raises(InvalidConfigError, match="forget_gone_s"):
        CoordinatorConfig(forget_gone_s=0)
    config = CoordinatorConfig(
        revoke_timeout_s=1.5, route_refresh_s=2.0, fence_timeout_s=2.0, forget_gone_s=0.5
    )
    coord = coordinator_for(group, cluster.namespace, config=config)
    host = Sentinel.remote()
    ray.get(host.ping.remote())
    join(coord, "short-lived", topic, actor_handle=host)
    ray.kill(host, no_restart=True)
    wait_until(lambda: "short-lived" not in status(coord)["members"], what="the drop")
    wait_until(lambda: status(coord)["gone_tracked"] == 0, timeout_s=10, what="forgotten")
    join(coord, "short-lived", topic)  # no longer refused: nothing of it is left
    assert "short-lived" in status(coord)["members"]


# ---------------------------------------------------------------------- push consumers
@ray.remote(num_cpus=0)
class DeliveryLog:
    """Every delivery of every consumer: (consumer, time, store host, queue id, offset)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str, int, int]] = []

    def record(self, consumer: str, at: float, rows: list[tuple[str, int, int]]) -> None:
        self.rows.extend((consumer, at, *r) for r in rows)

    def all(self) -> list[tuple[str, float, str, int, int]]:
        return self.rows

    def missing(self, tops: dict[tuple[str, int], int]) -> int:
        """How many offsets below ``tops`` ((store host, queue id) -> max offset) no
        consumer got yet."""
        seen = {(h, q, o) for _, _, h, q, o in self.rows}
        return sum((h, q, o) not in seen for (h, q), top in tops.items() for o in range(top))

    def count(self) -> int:
        return len(self.rows)


def recording(name: str, dlog: Any) -> Any:
    def listener(messages: list[Any]) -> ConsumeStatus:
        rows = [(m.store_host, m.queue_id, m.queue_offset) for m in messages]
        ray.get(dlog.record.remote(name, time.monotonic(), rows))  # recorded before the commit
        return ConsumeStatus.SUCCESS

    return listener


@ray.remote(num_cpus=0, max_concurrency=4)
class ConsumerHost:
    """A PushConsumer living in an actor that passes its handle, so the coordinator
    learns from Ray when the actor dies."""

    def __init__(self, namespace: str, group: str, topic: str, dlog: Any) -> None:
        me = ray.get_runtime_context().current_actor
        self.topic = topic
        self.consumer = PushConsumer(
            group,
            topic,
            listener=recording("H", dlog),
            namespace=namespace,
            actor_handle=me,
            **FAST,
        ).start()

    def client_id(self) -> str:
        return self.consumer.client_id

    def assigned(self) -> list[MessageQueue]:
        return self.consumer.assigned_queues()

    def wait_closed(self) -> bool:
        return self.consumer.wait_closed()


class Load:
    """A producer thread sending a few messages to every queue every 50 ms."""

    def __init__(self, cluster: actors.Cluster, topic: str, per_queue: int = 4) -> None:
        self.producer = cluster.producer("p-handoff", max_batch_messages=per_queue)
        self.topic, self.per_queue = topic, per_queue
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            n = 16 * self.per_queue
            self.producer.send_batch(
                [Message(self.topic, b"h%07d" % (self.sent + i)) for i in range(n)]
            )
            self.sent += n

    def finish(self) -> int:
        self.stop.set()
        self.thread.join(30)
        self.producer.close()
        return self.sent


def test_scaling_1_4_2_3_under_load_keeps_one_owner_per_queue_and_loses_nothing(
    cluster: actors.Cluster,
) -> None:
    started = time.monotonic()
    topic, group = "Handoff", "g-handoff"
    cluster.admin.create_topic(topic, 8, 8)  # 16 queues over 2 brokers
    queues = queues_of(cluster, topic)
    host_of = {
        name: ray.get(cluster.broker(name).status.remote())["addr"]
        for name in ("broker-a", "broker-b")
    }
    coord = coordinator_for(group, cluster.namespace, config=SHORT)
    dlog = DeliveryLog.remote()
    local: dict[str, PushConsumer] = {}
    changes: list[tuple[str, float]] = []

    names: dict[str, str] = {}

    def start_local(name: str) -> None:
        local[name] = PushConsumer(
            group, topic, listener=recording(name, dlog), namespace=cluster.namespace, **FAST
        ).start()
        names[local[name].client_id] = name

    def settled(members: dict[str, Any]) -> bool:
        s = status(coord)
        owners = {q: o for q, (o, _) in s["assignment"].items()}
        if sorted(s["members"]) != sorted(members) or owners != s["target"]:
            return False
        if s["pending_revokes"] or s["pending_fences"]:
            return False
        for cid, held in members.items():
            mine = sorted(q for q, o in owners.items() if o == cid)
            if sorted(held()) != mine:
                return False
        return all(q in owners for q in queues)

    def members() -> dict[str, Any]:
        out: dict[str, Any] = {c.client_id: c.assigned_queues for c in local.values()}
        if host is not None:
            out[host_id] = lambda: ray.get(host.assigned.remote())
        return out

    host: Any = None
    host_id = ""
    load: Load | None = None
    try:
        start_local("A")
        wait_until(lambda: settled(members()), what="A owns every queue")
        load = Load(cluster, topic)
        wait_until(lambda: ray.get(dlog.count.remote()) > 500, what="A consuming")

        # 1 -> 4: two consumers in this process, one in an actor
        changes.append(("1 -> 4 (+B +C +H)", time.monotonic()))
        start_local("B")
        start_local("C")
        host = ConsumerHost.remote(cluster.namespace, group, topic, dlog)
        host_id = ray.get(host.client_id.remote())
        names[host_id] = "H"
        wait_until(lambda: settled(members()), timeout_s=30, what="four consumers")
        shares = assign("averagely", group, queues, list(members()))
        assert all(len(s) == 4 for s in shares.values())

        # 4 -> 3: a graceful leave
        changes.append(("4 -> 3 (C leaves)", time.monotonic()))
        local.pop("C").shutdown()
        wait_until(lambda: settled(members()), what="three consumers")

        # 3 -> 2: the actor-hosted consumer crashes
        crashed = {q for q, o in status(coord)["assignment"].items() if o[0] == host_id}
        broker = {name: cluster.broker(name) for name in host_of}
        committed_before = {
            q: get(broker[q.broker_name].query_offset.remote(group, q.topic, q.queue_id), 30)
            for q in crashed
        }
        changes.append(("3 -> 2 (H killed)", time.monotonic()))
        ray.kill(host, no_restart=True)
        host = None
        wait_until(lambda: settled(members()), timeout_s=15, what="two consumers")

        # 2 -> 3
        changes.append(("2 -> 3 (+D)", time.monotonic()))
        start_local("D")
        wait_until(lambda: settled(members()), what="three consumers again")
        wait_until(lambda: local["D"].status().get("consumed", 0) > 100, what="D consuming")
        sent = load.finish()
        load = None
        tops = stored_ends(cluster, topic, host_of)
        assert sum(tops.values()) == sent

        wait_until(
            lambda: ray.get(dlog.missing.remote(tops)) == 0,
            timeout_s=30,
            interval_s=0.2,
            what="every message delivered",
        )
        wait_until(  # the owners' tokens still pass after all those moves
            lambda: sum(r["lag"] for r in cluster.admin.consumer_lag(group, topic)) == 0,
            what="every offset committed",
        )
        final_log = status(coord)["log"]
    finally:
        if load is not None:
            load.finish()
        if host is not None:
            ray.kill(host, no_restart=True)
        for c in local.values():
            c.shutdown()

    rows = ray.get(dlog.all.remote())
    deliveries: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for consumer, _, h, q, o in rows:
        deliveries[(h, q, o)].append(consumer)
    assert len(deliveries) == sent, "nothing lost"
    crash_floor = {(host_of[q.broker_name], q.queue_id): off for q, off in committed_before.items()}
    dups = {k: who for k, who in deliveries.items() if len(who) > 1}
    for (h, q, o), who in dups.items():
        assert sorted(who).count("H") == 1 and len(who) == 2, f"{(h, q, o)} went to {who}"
        assert (h, q) in crash_floor, f"{(h, q, o)} duplicated on a queue H did not own"
        assert o >= crash_floor[(h, q)], f"{(h, q, o)} was committed before the crash"
    print(f"\n{sent} messages, {len(dups)} redelivered after the crash (H's uncommitted)")

    final = owners_one_at_a_time(final_log)
    assert {q for q in final if q.topic == topic} == set(queues)
    print_handoffs(final_log, changes, rows, names, host_of)
    dead = [ev for ev in final_log if ev.event == "dead"]
    assert [ev.from_id for ev in dead] == [host_id], dead[:5]
    print(f"scenario took {time.monotonic() - started:.1f}s")


# ---------------------------------------------------------------------- the coordinator host
def test_groups_share_one_host_and_one_group_s_trouble_stays_in_it(
    cluster: actors.Cluster,
) -> None:
    """Every group's coordinator runs in the namespace's one coordinator host; a group's
    refused calls and its shutdown leave the others as they were; the admin and the
    console find the groups that have a coordinator, and make none."""
    topic, ns = "CoordHost", cluster.namespace
    cluster.admin.create_topic(topic, 2, 2)
    queues = queues_of(cluster, topic)
    assert coordinator_actor_name("g-host-a") == coordinator_actor_name("g-host-b")
    assert coordinator_actor_name("g-host-a") == "coordinators-0"
    a = coordinator_for("g-host-a", ns, config=SHORT)
    b = coordinator_for("g-host-b", ns, config=SHORT)
    assert sorted(join(a, "a-1", topic).owned) == queues
    assert sorted(join(b, "b-1", topic).owned) == queues  # each group owns the topic apart
    assert status(a)["node_id"] == status(b)["node_id"] == ray.get_runtime_context().get_node_id()
    with pytest.raises(InvalidConfigError, match="strategy"):
        join(b, "b-2", topic, strategy="consistent_hash")
    with pytest.raises(InvalidConfigError, match="client_id"):
        join(b, "", topic)
    assert sorted(view(a, "a-1").owned) == queues and sorted(view(b, "b-1").owned) == queues

    assert {"g-host-a", "g-host-b"} <= set(coordinated_groups(ns))
    assert find_coordinator("g-host-nobody", ns) is None  # looking makes none
    assert "g-host-nobody" not in coordinated_groups(ns)
    with pytest.raises(RayMQError, match="no coordinator"):
        cluster.admin.group_status("g-host-nobody")
    assert cluster.admin.group_status("g-host-a")["members"].keys() == {"a-1"}
    found = find_coordinator("g-host-a", ns)
    assert isinstance(found, CoordinatorHandle) and found.spec is None
    with pytest.raises(RayMQError, match="no coordinator"):  # a found handle makes none
        get(CoordinatorHandle(found.host, "g-host-nobody", None).status.remote(), 30)

    # b shut down: gone from the host, a as it was
    gen_a = status(a)["generation"]
    epoch_b = status(b)["epoch"]
    assert get(b.shutdown.remote(), 30) is True
    assert "g-host-b" not in coordinated_groups(ns) and find_coordinator("g-host-b", ns) is None
    assert status(a)["generation"] == gen_a and sorted(view(a, "a-1").owned) == queues
    # b's next call makes a new coordinator of b, which outranks the old one
    assert not view(b, "b-1").member
    assert sorted(join(b, "b-1", topic).owned) == queues
    assert status(b)["epoch"] > epoch_b
    assert status(b)["fences"].keys() == set(queues)  # fenced before the first assignment


def test_every_group_of_a_killed_host_joins_its_successor_and_loses_nothing(
    cluster: actors.Cluster,
) -> None:
    """Two groups of push consumers under load; their coordinator host is killed. Every
    member sees it gone, gives its queues up (committing) and joins again, which makes
    a new host; the groups' new coordinators take an epoch above the old ones' fences
    and hand every queue out again, one owner at a time; nothing is lost and every
    offset commits under the new tokens."""
    topic, ns = "CoordHostKill", cluster.namespace
    groups = ["g-kill-1", "g-kill-2"]
    cluster.admin.create_topic(topic, 4, 4)  # 8 queues over 2 brokers
    queues = queues_of(cluster, topic)
    host_of = {
        name: ray.get(cluster.broker(name).status.remote())["addr"]
        for name in ("broker-a", "broker-b")
    }
    dlogs = {g: DeliveryLog.remote() for g in groups}
    consumers: dict[str, list[PushConsumer]] = {g: [] for g in groups}
    load: Load | None = None

    def settled(group: str) -> dict[str, Any] | None:
        handle = find_coordinator(group, ns)  # makes none: the members' join does
        if handle is None:
            return None
        try:
            s = status(handle)
        except Exception:  # noqa: BLE001 - the host killed, the name not yet free
            return None
        owners = {q: o for q, (o, _) in s["assignment"].items() if q.topic == topic}
        mine = {c.client_id: c for c in consumers[group]}
        if sorted(s["members"]) != sorted(mine) or s["pending_revokes"] or s["pending_fences"]:
            return None
        if sorted(owners) != queues:
            return None
        for cid, c in mine.items():
            if sorted(q for q in c.assigned_queues() if q.topic == topic) != sorted(
                q for q, o in owners.items() if o == cid
            ):
                return None
        return s

    try:
        for g in groups:
            for name in ("1", "2"):
                consumers[g].append(
                    PushConsumer(
                        g,
                        topic,
                        listener=recording(name, dlogs[g]),
                        namespace=ns,
                        coordinator_config=SHORT,
                        **FAST,
                    ).start()
                )
        before = {
            g: wait_until(lambda g=g: settled(g), timeout_s=30, what=f"{g} settled") for g in groups
        }
        load = Load(cluster, topic, per_queue=2)
        for g in groups:
            wait_until(lambda g=g: ray.get(dlogs[g].count.remote()) > 100, what=f"{g} consuming")

        host = ray.get_actor(coordinator_actor_name(groups[0]), namespace=ns)
        ray.kill(host, no_restart=True)
        after = {
            g: wait_until(
                lambda g=g: (s := settled(g)) is not None and s["epoch"] > before[g]["epoch"] and s,
                timeout_s=40,
                what=f"{g} coordinated again",
            )
            for g in groups
        }
        new_host = ray.get_actor(coordinator_actor_name(groups[0]), namespace=ns)
        assert new_host._actor_id != host._actor_id
        sent_at_takeover = load.sent
        wait_until(lambda: load.sent > sent_at_takeover + 256, what="sends after the takeover")
        sent = load.finish()
        load = None
        tops = stored_ends(cluster, topic, host_of)
        assert sum(tops.values()) == sent
        for g in groups:
            wait_until(
                lambda g=g: ray.get(dlogs[g].missing.remote(tops)) == 0,
                timeout_s=30,
                interval_s=0.2,
                what=f"every message delivered to {g}",
            )
            wait_until(  # the new tokens pass on the brokers
                lambda g=g: sum(r["lag"] for r in cluster.admin.consumer_lag(g, topic)) == 0,
                what=f"every offset of {g} committed",
            )
        logs = {g: status(coordinator_for(g, ns))["log"] for g in groups}
    finally:
        if load is not None:
            load.finish()
        for cs in consumers.values():
            for c in cs:
                c.shutdown()

    for g in groups:
        old_fences = [tok[0] for tok in before[g]["fences"].values()]
        assert all(tok[0] == after[g]["epoch"] for _, tok in after[g]["assignment"].values())
        assert after[g]["epoch"] > max(old_fences, default=0)
        final = owners_one_at_a_time(logs[g])  # the new coordinator: one owner at a time
        assert {q for q in final if q.topic == topic} == set(queues)
        fenced = {q: tok for q, tok in after[g]["fences"].items() if q.topic == topic}
        assert sorted(fenced) == queues  # each fenced before its first assignment
        assert {tok[0] for tok in fenced.values()} == {after[g]["epoch"]}
        rows = ray.get(dlogs[g].all.remote())
        assert len({(h, q, o) for _, _, h, q, o in rows}) == sent, f"{g}: nothing lost"


def print_handoffs(
    log: list[Any],
    changes: list[tuple[str, float]],
    rows: list[tuple[str, float, str, int, int]],
    names: dict[str, str],
    host_of: dict[str, str],
) -> None:
    """Per membership change (measured, not asserted): from the coordinator seeing it
    to the last moved queue assigned, and to the last moved queue consumed again by
    its new owner (a few messages reach every queue every 50 ms)."""
    delivered: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for consumer, at, h, q, _ in rows:
        delivered[(consumer, h, q)].append(at)
    bounds = [t for _, t in changes[1:]] + [float("inf")]
    for (what, t0), t1 in zip(changes, bounds):
        trigger = [ev for ev in log if ev.event in ("join", "leave", "dead") and t0 <= ev.time < t1]
        if not trigger:
            continue
        since = trigger[-1].time
        assigns = [ev for ev in log if ev.event == "assign" and since <= ev.time < t1]
        if not assigns:
            continue
        consumed = []
        for ev in assigns:
            times = delivered.get(
                (names.get(ev.to_id, "?"), host_of[ev.queue.broker_name], ev.queue.queue_id), []
            )
            after = [t for t in times if t >= ev.time]
            if ev.queue.topic.startswith("%RETRY%") or not after:
                continue
            consumed.append(min(after))
        line = (
            f"{what}: coordinator saw the {trigger[-1].event} {1000 * (since - t0):.0f} ms after "
            f"the change; {len(assigns)} queue(s) assigned within "
            f"{1000 * (max(ev.time for ev in assigns) - since):.0f} ms"
        )
        if consumed:
            line += f", consumed again within {1000 * (max(consumed) - since):.0f} ms"
        print(line)

"""A DLedger member that loses entries it acknowledged (a power loss, a cut or replaced
disk), on real stores in a temp dir: three members of a Raft group, each a
``MessageStore`` with its CommitLog-backed Raft log (``actors.broker.ha.raft_log``, which
never starts Ray) and a ``RaftNode``, driven as the DLedger shell drives them (persist,
then send, then apply), with messages carried by hand.

* The follower: reopened on a CommitLog cut back below what it acknowledged (mid entry,
  its Raft index left longer than its CommitLog), it drops what it no longer holds,
  refuses the leader's appends past it with its real end as the hint, and takes the rest
  back from the leader, byte for byte.
* The leader: told so by that refusal (with or without Ray's death notice first), it
  forgets what the follower had acknowledged and probes below it, instead of refusing to
  look below its old match index forever.
* Durability: whatever the store's flush mode, what a member acknowledged is durable, so
  a power loss that keeps only the flushed CommitLog loses none of it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.broker.ha.raft_log import OWN_ENTRY, CommitLogRaftLog
from storage import Message, MessageStore, StoreConfig
from storage.raft import AppendEntries, AppendEntriesResponse, HardState, RaftNode
from storage.raft import Message as RaftMessage

IDS = ["a", "b", "c"]
TOPIC = "R"


def config(path: Path, host: str) -> StoreConfig:
    return StoreConfig(
        store_dir=str(path),
        commitlog_file_size=64 * 1024,
        consume_queue_file_entries=256,
        index_hash_slots=97,
        index_max_entries=4000,
        max_message_size=16 * 1024,
        store_host=host,
        flush_disk_type="ASYNC_FLUSH",  # the store alone would only flush in the background
    )


class Member:
    """One broker of the group: its store, its Raft log on the CommitLog and its node."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.dir = root / name
        self.host = f"10.0.0.{IDS.index(name) + 1}:10911"
        self.hard = HardState()  # what the shell's raftHardState file holds
        self.alive = False
        self.open()

    def open(self) -> None:
        self.store = MessageStore(config(self.dir, self.host), start_services=False)
        self.log = CommitLogRaftLog(self.store, self.dir / "raft")
        self.node = RaftNode(
            self.name,
            IDS,
            log=self.log,
            hard_state=self.hard,
            rng=random.Random(IDS.index(self.name)),
            election_timeout_ticks=(10, 20),
            heartbeat_ticks=2,
            max_append_entries=3,  # catching up takes several rounds
        )
        self.alive = True

    def ready(self) -> list[RaftMessage]:
        """The shell's order: persist (the hard state, then the log, synced), send, apply."""
        ready = self.node.ready()
        if ready.hard_state is not None:
            self.hard = ready.hard_state
        if ready.log_truncated_from is not None or len(ready.log_appended):
            self.log.sync()
        if len(ready.log_appended) and not self.node.is_leader:
            self.store.dispatch_replicated()
        return list(ready.messages)

    def put(self, batch: int) -> None:
        """The leader's put: into its store, then proposed as one entry (the shell's
        ``_propose``)."""
        rng = random.Random(batch)
        self.store.put_batch(
            [
                Message(
                    TOPIC,
                    f"{batch}-{i}-".encode() + rng.randbytes(rng.randint(1, 900)),
                    queue_id=i % 2,
                )
                for i in range(4)
            ]
        )
        self.log.prewritten(self.store.commitlog.max_offset)
        self.node.propose([OWN_ENTRY])

    def lose_power(self, keep: int) -> None:
        """Die and come back with the CommitLog cut back to ``keep`` as a power loss may leave
        it (zeros from there to its file's end, later files gone); the Raft index and the
        ConsumeQueues stay as the crash left them (longer)."""
        self.log.close()
        self.store.close()
        self.alive = False
        files = sorted((self.dir / "commitlog").iterdir())
        for f in files:
            base, size = int(f.name), f.stat().st_size
            if base >= keep and base > 0:
                f.unlink()
            elif base + size > keep:
                with f.open("r+b") as out:
                    out.seek(keep - base)
                    out.write(b"\x00" * (base + size - keep))
        (self.dir / "abort").touch()  # it did not stop cleanly

    def commitlog(self) -> bytes:
        out, offset = [], 0
        while offset < self.store.commitlog.max_offset:
            chunk = self.store.read_commitlog(offset, 1 << 20)
            out.append(chunk)
            offset += len(chunk)
        return b"".join(out)

    def messages(self) -> list[bytes]:
        return [m.body for q in (0, 1) for m in self.store.get("g", TOPIC, q, 0, 10_000).messages]

    def close(self) -> None:
        if self.alive:
            self.log.close()
            self.store.close()
            self.alive = False


@pytest.fixture
def group(tmp_path: Path):  # type: ignore[no-untyped-def]
    members = {n: Member(tmp_path, n) for n in IDS}
    yield members
    for m in members.values():
        m.close()


def pump(group: dict[str, Member]) -> list[RaftMessage]:
    """Carry every message (and the answers) between living members until none is left."""
    delivered: list[RaftMessage] = []
    for _ in range(500):
        msgs = [msg for m in group.values() if m.alive for msg in m.ready()]
        if not msgs:
            return delivered
        for msg in msgs:
            if group[msg.dst].alive:
                delivered.append(msg)
                group[msg.dst].node.receive(msg)
    raise AssertionError("the network never went quiet")


def heartbeat(group: dict[str, Member], leader: Member) -> list[RaftMessage]:
    for _ in range(leader.node.config.heartbeat_ticks):
        leader.node.tick()
    return pump(group)


def elect_a(group: dict[str, Member]) -> Member:
    leader = group["a"]
    leader.node.start_election_now()
    pump(group)
    assert leader.node.is_leader
    return leader


def replicate(group: dict[str, Member], leader: Member, batches: range) -> None:
    for batch in batches:
        leader.put(batch)
        pump(group)


@pytest.mark.parametrize("death_notice", [False, True], ids=["heartbeat", "death-notice"])
def test_the_leader_probes_below_a_follower_that_lost_what_it_acknowledged(
    group: dict[str, Member], death_notice: bool
) -> None:
    leader, b = elect_a(group), group["b"]
    replicate(group, leader, range(12))
    acknowledged = leader.node.match_index("b")
    assert acknowledged == leader.log.last_index == b.log.last_index == 13  # no-op + 12
    assert leader.node.commit_index == 13

    b.lose_power(keep=b.log.end_of(4) + 100)  # entries 5..13 acknowledged, then lost
    replicate(group, leader, range(12, 15))  # the group goes on with a and c
    b.open()
    assert b.log.last_index == 4 < acknowledged
    assert b.store.commitlog.max_offset == b.log.end_of(4)  # the torn entry 5 is cut off

    if death_notice:  # Ray told the leader that b died: it probes from b's old match
        leader.node.on_peer_dead("b")
    delivered = heartbeat(group, leader)
    refusals = [m for m in delivered if isinstance(m, AppendEntriesResponse) and not m.success]
    assert refusals and refusals[0].src == "b"
    assert refusals[0].conflict_index == 5 and refusals[0].conflict_term == 0
    resent = [m for m in delivered if isinstance(m, AppendEntries) and m.dst == "b" and m.entries]
    assert min(m.prev_index for m in resent) == 4  # below the match index b acknowledged

    assert leader.node.match_index("b") == leader.log.last_index == b.log.last_index == 16
    assert b.node.commit_index == leader.node.commit_index == 16
    assert b.commitlog() == leader.commitlog()
    assert sorted(b.messages()) == sorted(leader.messages())
    assert len(b.messages()) == 15 * 4


def test_a_follower_refuses_appends_past_what_it_kept_and_takes_back_what_it_lost(
    group: dict[str, Member],
) -> None:
    leader, b = elect_a(group), group["b"]
    replicate(group, leader, range(9))
    old_end = b.store.commitlog.max_offset
    keep = b.log.end_of(3)
    b.lose_power(keep=keep + 7)  # mid entry 4: its first bytes survive, torn
    index_entries = ((b.dir / "raft" / "index").stat().st_size - 16) // 16
    assert index_entries == 10  # the Raft index still lists everything b acknowledged
    b.open()
    assert (b.log.last_index, b.log.end, b.store.commitlog.max_offset) == (3, keep, keep)
    assert b.store.max_offset(TOPIC, 0) + b.store.max_offset(TOPIC, 1) < 9 * 4

    # the leader's heartbeat at what b had acknowledged: refused, hinting at b's real end
    b.node.receive(AppendEntries("a", "b", leader.node.term, 10, leader.log.term_at(10), (), 10))
    (answer,) = b.ready()
    assert isinstance(answer, AppendEntriesResponse) and not answer.success
    assert (answer.reject_index, answer.conflict_index, answer.conflict_term) == (10, 4, 0)
    assert b.node.commit_index == 0  # it verified nothing it lost

    # from there, the leader's entries: accepted, synced, dispatched
    entries = tuple(leader.log.entries(4, max_bytes=1 << 20, max_count=100))
    b.node.receive(AppendEntries("a", "b", leader.node.term, 3, leader.log.term_at(3), entries, 10))
    (answer,) = b.ready()
    assert isinstance(answer, AppendEntriesResponse) and answer.success
    assert answer.match_index == 10 and b.node.commit_index == 10
    assert b.store.commitlog.max_offset == old_end
    assert b.commitlog() == leader.commitlog()
    assert sorted(b.messages()) == sorted(leader.messages())

    # and it survives another power loss that keeps only what it flushed: it synced it
    b.lose_power(keep=b.store.commitlog.flushed_offset)
    b.open()
    assert b.log.last_index == 10 and b.commitlog() == leader.commitlog()


def test_what_a_member_acknowledged_is_durable_whatever_the_flush_mode(
    group: dict[str, Member],
) -> None:
    leader = elect_a(group)
    replicate(group, leader, range(6))
    for m in group.values():
        assert not m.store.config.sync_flush and m.log.last_index == 7
        # acknowledged (counted towards the commit) only once in the CommitLog on disk
        assert m.store.commitlog.flushed_offset >= m.log.end_of(leader.node.match_index("b"))
    for name in ("b", "c"):  # both followers lose power at once
        group[name].lose_power(keep=group[name].store.commitlog.flushed_offset)
        group[name].open()
        assert group[name].log.last_index == 7
        assert group[name].commitlog() == leader.commitlog()

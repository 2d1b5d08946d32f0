"""RaftNode's rules, one at a time, with messages delivered by hand."""

from __future__ import annotations

import pickle
import random
from collections.abc import Collection

import pytest

from storage.errors import InvalidConfigError, InvalidMessageError
from storage.raft import (
    AppendEntries,
    AppendEntriesResponse,
    Entry,
    HardState,
    InMemoryRaftLog,
    Message,
    NotLeaderError,
    RaftConfig,
    RaftNode,
    RaftSafetyError,
    Ready,
    RequestVote,
    RequestVoteResponse,
    Role,
    TimeoutNow,
)

LO, HI = 10, 20


def make_group(
    n: int = 3, logs: dict[str, list[Entry]] | None = None, term: int = 0, **options: object
) -> dict[str, RaftNode]:
    ids = [f"n{i}" for i in range(n)]
    options.setdefault("election_timeout_ticks", (LO, HI))
    options.setdefault("heartbeat_ticks", 2)
    logs = logs or {}
    return {
        i: RaftNode(
            i,
            ids,
            rng=random.Random(k),
            log=InMemoryRaftLog(logs.get(i, [])),
            hard_state=HardState(term),
            **options,  # type: ignore[arg-type]
        )
        for k, i in enumerate(ids)
    }


def pump(nodes: dict[str, RaftNode], cut: Collection[tuple[str, str]] = ()) -> list[Message]:
    """Deliver every message (and the answers) until none is left; return all delivered.

    Links in ``cut`` (src, dst) and nodes missing from ``nodes`` drop messages.
    """
    delivered: list[Message] = []
    for _ in range(200):
        msgs = [m for node in nodes.values() for m in node.ready().messages]
        if not msgs:
            return delivered
        for m in msgs:
            if m.dst in nodes and (m.src, m.dst) not in cut:
                delivered.append(m)
                nodes[m.dst].receive(m)
    raise AssertionError("the network never went quiet")


def elect(nodes: dict[str, RaftNode], who: str, cut: Collection[tuple[str, str]] = ()) -> RaftNode:
    nodes[who].start_election_now()
    pump(nodes, cut)
    assert nodes[who].is_leader
    return nodes[who]


def isolate(node: str, nodes: Collection[str]) -> set[tuple[str, str]]:
    return {(a, b) for a in nodes for b in nodes if a != b and node in (a, b)}


def tick_until_heartbeat(node: RaftNode) -> None:
    for _ in range(node.config.heartbeat_ticks):
        node.tick()


def entries_of(node: RaftNode) -> list[Entry]:
    return node.log.entries(1, max_bytes=1 << 30, max_count=1 << 30)


# -- elections


def test_a_single_node_elects_itself_once_its_election_timeout_passes() -> None:
    node = RaftNode("a", ["a"], election_timeout_ticks=(3, 3), heartbeat_ticks=1)
    node.tick()
    node.tick()
    assert node.role is Role.FOLLOWER
    node.tick()
    assert node.is_leader
    ready = node.ready()
    assert ready.hard_state == HardState(term=1, voted_for="a")
    assert ready.soft_state is not None and ready.soft_state.role is Role.LEADER
    assert ready.log_appended == range(1, 2)  # the new leader's no-op...
    assert ready.committed == range(1, 2)  # ...committed at once by a group of one
    assert node.log.term_at(1) == 1


@pytest.mark.parametrize("seed", range(5))
def test_a_follower_campaigns_after_a_random_timeout_within_the_configured_range(
    seed: int,
) -> None:
    node = RaftNode("a", ["a", "b", "c"], rng=random.Random(seed), election_timeout_ticks=(LO, HI))
    ticks = 0
    while not node.ready().messages:
        node.tick()
        ticks += 1
    assert LO <= ticks <= HI
    assert node.role is Role.PRE_CANDIDATE


def test_pre_vote_then_vote_elects_a_leader_that_the_others_follow() -> None:
    nodes = make_group()
    n0 = nodes["n0"]
    n0.start_election_now()
    ready = n0.ready()
    assert ready.hard_state is None  # a pre-vote changes no persistent state
    assert {type(m) for m in ready.messages} == {RequestVote}
    assert all(m.pre_vote and m.term == 1 for m in ready.messages if isinstance(m, RequestVote))
    assert n0.term == 0
    for m in ready.messages:
        nodes[m.dst].receive(m)
    pump(nodes)
    assert n0.is_leader and n0.term == 1
    assert all(nodes[i].leader_id == "n0" and nodes[i].term == 1 for i in ("n1", "n2"))
    assert [nodes[i].voted_for for i in ("n0", "n1", "n2")] == ["n0", "n0", "n0"]


def test_a_pre_vote_changes_neither_the_voters_term_nor_its_vote() -> None:
    node = make_group()["n1"]
    node.receive(RequestVote("n0", "n1", 5, 0, 0, pre_vote=True))
    ready = node.ready()
    assert (node.term, node.voted_for, ready.hard_state) == (0, None, None)
    assert ready.messages == (RequestVoteResponse("n1", "n0", 5, True, pre_vote=True),)


def test_a_vote_is_persisted_in_the_same_ready_that_sends_it() -> None:
    node = make_group()["n1"]
    node.receive(RequestVote("n0", "n1", 1, 0, 0))
    ready = node.ready()
    assert ready.must_sync and ready.hard_state == HardState(1, "n0")
    assert ready.messages == (RequestVoteResponse("n1", "n0", 1, True),)


def _voter_with_log(entries: list[Entry]) -> RaftNode:
    return RaftNode("v", ["v", "c", "d"], log=InMemoryRaftLog(entries), hard_state=HardState(2))


@pytest.mark.parametrize(
    ("last_index", "last_term", "granted"),
    [
        (3, 2, True),  # same last term, same length
        (4, 2, True),  # same last term, longer
        (2, 2, False),  # same last term, shorter
        (9, 1, False),  # older last term, however long
        (1, 3, True),  # newer last term, however short
    ],
)
def test_a_vote_goes_only_to_a_candidate_whose_log_is_at_least_as_up_to_date(
    last_index: int, last_term: int, granted: bool
) -> None:
    voter = _voter_with_log([Entry(1, b"a"), Entry(2, b"b"), Entry(2, b"c")])
    voter.receive(RequestVote("c", "v", 3, last_index, last_term))
    [answer] = voter.ready().messages
    assert isinstance(answer, RequestVoteResponse) and answer.granted is granted
    assert voter.voted_for == ("c" if granted else None)


def test_one_vote_per_term_but_a_repeated_request_gets_the_same_answer() -> None:
    voter = _voter_with_log([])
    voter.receive(RequestVote("c", "v", 3, 0, 0))
    voter.receive(RequestVote("d", "v", 3, 5, 5))
    voter.receive(RequestVote("c", "v", 3, 0, 0))
    granted = [m.granted for m in voter.ready().messages if isinstance(m, RequestVoteResponse)]
    assert granted == [True, False, True]
    assert voter.hard_state == HardState(3, "c")


def test_a_candidate_of_an_older_term_is_refused_with_the_current_term() -> None:
    voter = _voter_with_log([])
    voter.receive(RequestVote("c", "v", 1, 0, 0))
    assert voter.ready().messages == (RequestVoteResponse("v", "c", 2, False),)


def test_a_follower_in_its_leaders_lease_ignores_candidates_unless_the_leader_is_dead() -> None:
    nodes = make_group()
    elect(nodes, "n0")
    n1 = nodes["n1"]
    n1.receive(RequestVote("n2", "n1", 7, 100, 100))
    assert (n1.term, n1.ready().messages) == (1, ())
    n1.receive(RequestVote("n2", "n1", 7, 100, 100, force=True))
    assert n1.term == 7 and n1.voted_for == "n2"


def test_a_node_with_a_stale_log_can_neither_win_nor_bump_the_term() -> None:
    nodes = make_group()
    elect(nodes, "n0")
    nodes["n0"].propose([b"x"])
    pump(nodes, cut=isolate("n2", nodes))  # n2 misses the write
    survivors = {i: nodes[i] for i in ("n1", "n2")}
    survivors["n2"].start_election_now()
    pump(survivors)
    assert not nodes["n2"].is_leader
    assert nodes["n2"].term == nodes["n1"].term == 1  # the refused pre-vote bumped nothing
    survivors["n1"].start_election_now()
    pump(survivors)
    assert nodes["n1"].is_leader and nodes["n1"].term == 2


# -- terms


def test_a_leader_steps_down_when_it_sees_a_higher_term() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    n0.receive(AppendEntriesResponse("n1", "n0", 5, False))
    assert (n0.role, n0.term, n0.leader_id, n0.voted_for) == (Role.FOLLOWER, 5, None, None)
    with pytest.raises(NotLeaderError):
        n0.propose([b"x"])


def test_an_append_from_a_newer_leader_makes_a_candidate_its_follower() -> None:
    node = make_group()["n1"]
    node.start_election_now()
    node.receive(AppendEntries("n2", "n1", 3, 0, 0, (), 0))
    assert (node.role, node.term, node.leader_id) == (Role.FOLLOWER, 3, "n2")


def test_an_append_from_a_deposed_leader_is_refused_with_the_current_term() -> None:
    node = _voter_with_log([])
    node.receive(AppendEntries("c", "v", 1, 0, 0, (Entry(1, b"x"),), 0))
    [answer] = node.ready().messages
    assert isinstance(answer, AppendEntriesResponse)
    assert (answer.term, answer.success, node.log.last_index) == (2, False, 0)


def test_a_stale_leader_never_gets_a_write_acknowledged() -> None:
    nodes = make_group()
    old = elect(nodes, "n0")
    cut = isolate("n0", nodes)
    new = elect(nodes, "n1", cut)  # n1 and n2 move on; n0 does not hear of it
    assert old.is_leader and old.term == 1 and new.term == 2
    stale = old.propose([b"stale"])
    fresh = new.propose([b"fresh"])
    pump(nodes, cut)
    assert old.commit_index < stale.first_index
    assert new.commit_index >= fresh.last_index
    tick_until_heartbeat(new)  # the partition heals: n0 hears of term 2
    pump(nodes)
    assert old.role is Role.FOLLOWER and old.leader_id == "n1"
    assert old.log.term_at(stale.first_index) != stale.term  # the stale write is gone
    assert old.commit_index >= fresh.last_index
    assert old.log.term_at(fresh.last_index) == fresh.term


# -- death notices


def test_a_death_notice_of_the_leader_starts_an_election_at_once() -> None:
    nodes = make_group()
    elect(nodes, "n0")
    n1 = nodes["n1"]
    n1.on_peer_dead("n2")  # not the leader: nothing to do
    assert not n1.ready().messages
    n1.on_peer_dead("n0")
    votes = n1.ready().messages
    assert votes and all(isinstance(m, RequestVote) and m.force for m in votes)
    nodes["n2"].receive(next(m for m in votes if m.dst == "n2"))
    survivors = {i: nodes[i] for i in ("n1", "n2")}
    pump(survivors)
    assert n1.is_leader and n1.term == 2  # without a single tick


def test_survivors_told_at_once_stagger_their_campaigns_by_member_rank() -> None:
    nodes = make_group(death_notice_stagger_ticks=3)
    elect(nodes, "n0")
    survivors = {i: nodes[i] for i in ("n1", "n2")}
    nodes["n2"].on_peer_dead("n0")  # rank 1: waits 3 ticks
    assert not nodes["n2"].ready().messages
    nodes["n1"].on_peer_dead("n0")  # rank 0: now
    pump(survivors)
    assert nodes["n1"].is_leader
    for _ in range(3 * 3):
        nodes["n2"].tick()  # the pending campaign was cancelled by n2's vote
    assert nodes["n2"].role is Role.FOLLOWER and nodes["n2"].leader_id == "n1"


def test_a_dead_leaders_messages_still_in_flight_do_not_undo_its_death_notice() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    tick_until_heartbeat(n0)
    in_flight = [m for m in n0.ready().messages if m.dst == "n1"]
    assert in_flight
    nodes["n1"].on_peer_dead("n0")
    for m in in_flight:
        nodes["n1"].receive(m)
    assert nodes["n1"].role is Role.PRE_CANDIDATE and nodes["n1"].leader_id is None


def test_a_leader_told_of_a_dead_follower_sends_it_everything_unacknowledged_again() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    pump(nodes)
    n0.propose([b"a", b"b"])
    n0.ready()  # lost with the follower
    assert n0.match_index("n1") == 1
    n0.on_peer_dead("n1")
    [resent] = [m for m in n0.ready().messages if m.dst == "n1"]
    assert isinstance(resent, AppendEntries) and resent.prev_index == 1
    assert [e.data for e in resent.entries] == [b"a", b"b"]
    nodes["n1"].receive(resent)
    pump(nodes)
    assert n0.match_index("n1") == 3


def test_a_follower_that_lost_acknowledged_entries_is_probed_below_its_old_match() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    n0.propose([b"a", b"b", b"c"])
    pump(nodes)
    assert n0.match_index("n1") == 4
    nodes["n1"].log.truncate_from(3)  # a crash took what it had not synced
    nodes["n1"].restart()
    tick_until_heartbeat(n0)
    delivered = pump(nodes)
    [refused] = [m for m in delivered if isinstance(m, AppendEntriesResponse) and not m.success]
    assert (refused.src, refused.reject_index, refused.conflict_index) == ("n1", 4, 3)
    resent = [m for m in delivered if isinstance(m, AppendEntries) and m.dst == "n1" and m.entries]
    assert resent[0].prev_index == 2
    assert n0.match_index("n1") == 4 and entries_of(nodes["n1"]) == entries_of(n0)


def test_an_old_refusal_never_makes_the_leader_forget_what_a_follower_acknowledged() -> None:
    nodes = make_group(logs={"n0": [Entry(1, b"a"), Entry(1, b"b")]}, term=1)
    n0 = elect(nodes, "n0", cut=isolate("n1", nodes))
    tick_until_heartbeat(n0)  # the probe was lost: asked again
    [probe] = [m for m in n0.ready().messages if m.dst == "n1"]
    nodes["n1"].receive(probe)
    [refusal] = nodes["n1"].ready().messages  # its log is empty: from 1, please
    assert isinstance(refusal, AppendEntriesResponse) and refusal.conflict_index == 1
    n0.receive(refusal)
    pump(nodes)
    assert n0.match_index("n1") == 3
    n0.receive(refusal)  # a duplicate, delivered late: nothing was lost since
    assert n0.match_index("n1") == 3
    assert not [m for m in n0.ready().messages if m.dst == "n1"]


def test_start_election_now_campaigns_without_waiting_and_is_a_no_op_on_a_leader() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    n0.start_election_now()
    assert n0.is_leader and n0.term == 1


# -- replication


def test_a_follower_refuses_a_mismatched_prev_entry_with_hints_for_the_leader() -> None:
    log = [Entry(1, b"a"), Entry(1, b"b"), Entry(2, b"c"), Entry(2, b"d"), Entry(2, b"e")]
    node = RaftNode("f", ["f", "l", "m"], log=InMemoryRaftLog(log), hard_state=HardState(3))
    node.receive(AppendEntries("l", "f", 3, 5, 3, (), 0))
    node.receive(AppendEntries("l", "f", 3, 9, 3, (), 0))
    mismatch, too_far = (m for m in node.ready().messages if isinstance(m, AppendEntriesResponse))
    assert (mismatch.success, mismatch.reject_index) == (False, 5)
    assert (mismatch.conflict_term, mismatch.conflict_index) == (2, 3)  # first entry of term 2
    assert (too_far.success, too_far.conflict_term, too_far.conflict_index) == (False, 0, 6)
    assert node.log.last_index == 5


def test_a_follower_truncates_a_divergent_uncommitted_tail() -> None:
    log = [Entry(1, b"a"), Entry(1, b"b"), Entry(2, b"x"), Entry(2, b"y")]
    node = RaftNode("f", ["f", "l", "m"], log=InMemoryRaftLog(log), hard_state=HardState(2))
    node.receive(AppendEntries("l", "f", 3, 2, 1, (Entry(3, b"c"),), 2))
    ready = node.ready()
    assert ready.log_truncated_from == 3 and ready.log_appended == range(3, 4)
    assert [e.data for e in entries_of(node)] == [b"a", b"b", b"c"]
    assert ready.messages == (AppendEntriesResponse("f", "l", 3, True, match_index=3),)
    assert node.commit_index == 2


def test_a_duplicate_or_overtaken_append_never_truncates_newer_entries() -> None:
    log = [Entry(1, b"a"), Entry(1, b"b"), Entry(1, b"c"), Entry(1, b"d")]
    node = RaftNode("f", ["f", "l", "m"], log=InMemoryRaftLog(log), hard_state=HardState(1))
    node.receive(AppendEntries("l", "f", 1, 0, 0, (Entry(1, b"a"), Entry(1, b"b")), 0))
    ready = node.ready()
    assert node.log.last_index == 4 and ready.log_truncated_from is None
    assert ready.messages == (AppendEntriesResponse("f", "l", 1, True, match_index=2),)


def test_a_leader_contradicting_a_committed_entry_is_a_safety_error() -> None:
    log = [Entry(1, b"a"), Entry(1, b"b")]
    node = RaftNode(
        "f", ["f", "l", "m"], log=InMemoryRaftLog(log), hard_state=HardState(1), applied_index=2
    )
    with pytest.raises(RaftSafetyError, match="committed entry 2"):
        node.receive(AppendEntries("l", "f", 2, 1, 1, (Entry(2, b"z"),), 2))


def test_a_follower_commits_only_what_it_has_verified_matches_the_leader() -> None:
    node = RaftNode("f", ["f", "l", "m"])
    node.receive(AppendEntries("l", "f", 1, 0, 0, (Entry(1, b"a"), Entry(1, b"b")), 10))
    assert node.commit_index == 2
    assert node.ready().committed == range(1, 3)


def test_a_leader_backtracks_over_a_long_divergent_tail_in_one_round_trip_per_term() -> None:
    common = [Entry(1, b"c")] * 3
    leader_log = common + [Entry(3, b"L")] * 50
    nodes = make_group(
        logs={"n0": leader_log, "n1": common + [Entry(2, b"F")] * 200, "n2": leader_log},
        term=3,
        noop_on_election=False,
    )
    n0 = elect(nodes, "n0", cut=isolate("n1", nodes))
    tick_until_heartbeat(n0)  # the first probe went nowhere
    delivered = pump(nodes)
    refusals = [
        m
        for m in delivered
        if isinstance(m, AppendEntriesResponse) and m.src == "n1" and not m.success
    ]
    assert len(refusals) == 1  # term 2 skipped at once
    assert entries_of(nodes["n1"]) == leader_log


def test_a_leader_commits_an_earlier_terms_entry_only_with_one_of_its_own() -> None:
    # Raft's figure 8: a majority holding an entry of an earlier term does not make it
    # committed; a leader counts replicas only for entries of its own term.
    old = [Entry(1, b"a"), Entry(2, b"b")]
    nodes = make_group(
        logs={"n0": old, "n1": old[:1], "n2": old[:1]}, term=3, noop_on_election=False
    )
    n0 = elect(nodes, "n0")
    pump(nodes)
    assert all(nodes[i].log.last_index == 2 for i in nodes)  # on every node...
    assert n0.commit_index == 0  # ...and still not committed
    proposal = n0.propose([b"c"])
    pump(nodes)
    assert n0.commit_index == proposal.last_index == 3
    assert (proposal.term, n0.log.term_at(3)) == (4, 4)


def test_a_new_leaders_no_op_commits_the_earlier_terms_entries_at_once() -> None:
    old = [Entry(1, b"a"), Entry(2, b"b")]
    nodes = make_group(logs={"n0": old, "n1": old[:1], "n2": old[:1]}, term=3)
    n0 = elect(nodes, "n0")
    pump(nodes)
    assert n0.commit_index == 3 and n0.log.term_at(3) == 4
    assert nodes["n0"].log.entries(3, max_bytes=1, max_count=1) == [Entry(4, b"")]


def test_replication_is_batched_within_the_byte_budget_and_the_inflight_window() -> None:
    nodes = make_group(max_append_bytes=10, max_inflight=2)
    n0 = elect(nodes, "n0")
    pump(nodes)
    proposal = n0.propose([b"abcd"] * 10)
    msgs = [m for m in nodes["n0"].ready().messages if isinstance(m, AppendEntries)]
    to_n1 = [m for m in msgs if m.dst == "n1"]
    assert len(to_n1) == 2  # the inflight window
    assert all(sum(len(e.data) for e in m.entries) <= 10 for m in to_n1)
    assert [len(m.entries) for m in to_n1] == [2, 2]
    for m in msgs:
        nodes[m.dst].receive(m)
    pump(nodes)
    assert n0.commit_index == proposal.last_index
    tick_until_heartbeat(n0)  # followers learn the commit index with the next append
    pump(nodes)
    assert all(nodes[i].commit_index == proposal.last_index for i in nodes)


def test_proposals_between_two_readies_share_one_append_per_follower() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    pump(nodes)
    for i in range(5):
        n0.propose([b"m%d" % i])
    appends = [m for m in n0.ready().messages if isinstance(m, AppendEntries)]
    assert sorted(m.dst for m in appends) == ["n1", "n2"]
    assert all(len(m.entries) == 5 for m in appends)


# -- proposals


def test_a_proposal_is_acknowledged_when_its_indexes_are_committed_with_its_term() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    pump(nodes)
    n0.ready()
    proposal = n0.propose([b"a", b"b"])
    assert proposal.indexes == range(2, 4) and proposal.term == 1  # after the no-op
    pump(nodes)
    assert n0.commit_index == 3
    assert all(n0.log.term_at(i) == proposal.term for i in proposal.indexes)


def test_a_follower_refuses_proposals_and_names_the_leader() -> None:
    nodes = make_group()
    with pytest.raises(NotLeaderError, match="leader unknown") as unknown:
        nodes["n1"].propose([b"x"])
    assert unknown.value.leader_hint is None
    elect(nodes, "n0")
    with pytest.raises(NotLeaderError, match="leader hint: n0") as known:
        nodes["n1"].propose([b"x"])
    assert (known.value.leader_hint, known.value.node_id, known.value.term) == ("n0", "n1", 1)


@pytest.mark.parametrize(
    ("entries", "match"),
    [([], "at least one entry"), ([b"a", "b"], r"entries\[1\]: expected bytes"), ([b""], "empty")],
)
def test_a_malformed_proposal_is_refused_and_changes_nothing(entries: list, match: str) -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    last = n0.log.last_index
    with pytest.raises(InvalidMessageError, match=match):
        n0.propose(entries)
    assert n0.log.last_index == last


# -- check quorum and leadership transfer


def test_a_leader_that_hears_from_no_quorum_steps_down() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    pump(nodes)
    for _ in range(LO):
        n0.tick()
        n0.ready()  # into the void
    assert n0.is_leader  # the election's answers count for the first period
    for _ in range(LO):
        n0.tick()
        n0.ready()
    assert n0.role is Role.FOLLOWER
    with pytest.raises(NotLeaderError):
        n0.propose([b"x"])


def test_leadership_moves_to_a_caught_up_follower_on_request() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    pump(nodes)
    n0.transfer_leadership("n1")
    assert any(isinstance(m, TimeoutNow) for m in n0.ready().messages if m.dst == "n1")
    n0.transfer_leadership("n1")
    pump(nodes)
    assert nodes["n1"].is_leader and nodes["n1"].term == 2
    assert n0.role is Role.FOLLOWER and n0.leader_id == "n1"


def test_a_transfer_waits_for_the_target_to_catch_up_and_refuses_writes_meanwhile() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    n0.propose([b"x"])
    pump(nodes, cut={("n0", "n2")})
    n0.transfer_leadership("n2")
    with pytest.raises(NotLeaderError, match="transferred") as e:
        n0.propose([b"y"])
    assert e.value.leader_hint == "n2"
    pump(nodes)
    assert nodes["n2"].is_leader
    assert nodes["n2"].log.last_index >= 2


def test_a_transfer_to_a_non_member_is_refused() -> None:
    n0 = elect(make_group(), "n0")
    with pytest.raises(InvalidConfigError, match="not a member"):
        n0.transfer_leadership("n9")


# -- crashes and the shell's contract


def test_restart_keeps_term_vote_and_log_and_loses_the_rest() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    n0.propose([b"a", b"b"])
    pump(nodes)
    n0.restart(applied_index=1)
    assert (n0.role, n0.leader_id, n0.term, n0.voted_for) == (Role.FOLLOWER, None, 1, "n0")
    assert (n0.log.last_index, n0.commit_index) == (3, 1)
    ready = n0.ready()
    assert ready.hard_state is None and ready.committed == range(0)


def test_a_restarted_node_reports_committed_entries_past_its_applied_index_again() -> None:
    nodes = make_group()
    n0 = elect(nodes, "n0")
    n0.propose([b"a", b"b"])
    pump(nodes)
    pump(nodes)  # the commit index reaches the followers
    n1 = nodes["n1"]
    n1.restart(applied_index=1)
    assert n1.commit_index == 1
    tick_until_heartbeat(n0)
    for m in n0.ready().messages:
        nodes[m.dst].receive(m)
    assert n1.ready().committed == range(2, 4)


def test_a_node_booted_from_persisted_state_resumes_where_it_was() -> None:
    log = InMemoryRaftLog([Entry(1, b"a"), Entry(2, b"b")])
    node = RaftNode("a", ["a", "b", "c"], log=log, hard_state=HardState(2, "b"), applied_index=1)
    assert (node.term, node.voted_for, node.commit_index) == (2, "b", 1)
    node.receive(RequestVote("c", "a", 2, 5, 2))
    assert node.ready().messages == (RequestVoteResponse("a", "c", 2, False),)


def test_a_log_ahead_of_the_persisted_term_raises_the_term_without_a_vote() -> None:
    # A crash between syncing the log and writing the hard state.
    log = InMemoryRaftLog([Entry(3, b"a")])
    node = RaftNode("a", ["a", "b", "c"], log=log, hard_state=HardState(2, "b"))
    assert (node.term, node.voted_for) == (3, None)
    assert node.ready().hard_state == HardState(3, None)


def test_an_applied_index_past_the_log_means_lost_state() -> None:
    with pytest.raises(RaftSafetyError, match="applied_index 3 is outside the log"):
        RaftNode("a", ["a", "b"], log=InMemoryRaftLog([Entry(1, b"a")]), applied_index=3)


def test_ready_is_empty_when_nothing_happened_and_has_ready_agrees() -> None:
    node = make_group()["n1"]
    node.ready()
    assert not node.has_ready()
    node.tick()
    assert not node.has_ready() and not node.ready() and node.ready() == Ready()
    node.receive(RequestVote("n0", "n1", 1, 0, 0))
    assert node.has_ready()


def test_messages_survive_pickling_as_ray_would_ship_them() -> None:
    entries = (Entry(1, b"a"), Entry(2, b"b"))
    msgs: list[Message] = [
        RequestVote("a", "b", 3, 2, 2, pre_vote=True, force=True),
        RequestVoteResponse("b", "a", 3, True, pre_vote=True),
        AppendEntries("a", "b", 3, 1, 1, entries, 1),
        AppendEntriesResponse("b", "a", 3, False, 0, 4, 2, 1),
        TimeoutNow("a", "b", 3),
    ]
    assert [pickle.loads(pickle.dumps(m)) for m in msgs] == msgs


def test_a_message_for_another_node_is_a_wiring_bug() -> None:
    node = make_group()["n1"]
    with pytest.raises(ValueError, match="delivered to 'n1'"):
        node.receive(TimeoutNow("n0", "n2", 1))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"election_timeout_ticks": (5, 4)}, "election_timeout_ticks"),
        ({"election_timeout_ticks": (0, 4)}, "election_timeout_ticks"),
        ({"heartbeat_ticks": 10}, "heartbeat_ticks=10"),
        ({"max_inflight": 0}, "max_inflight=0"),
        ({"no_such_option": 1}, "unknown Raft option"),
    ],
)
def test_bad_configuration_is_refused_with_the_field_named(options: dict, match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        RaftNode("a", ["a", "b", "c"], **options)


def test_config_fields_can_be_given_directly_or_as_a_config() -> None:
    a = RaftNode("a", ["a"], election_timeout_ticks=(4, 8), heartbeat_ticks=1)
    b = RaftNode("a", ["a"], config=RaftConfig(election_timeout_ticks=(4, 8), heartbeat_ticks=1))
    assert a.config == b.config

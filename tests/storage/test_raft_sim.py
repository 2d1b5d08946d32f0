"""Raft in a deterministic simulated network: safety after every tick, liveness after healing.

Each seed builds a random group (3, 4 or 5 nodes, random timeouts, budgets,
pre-vote and check-quorum on or off) on a random network (drops, duplicates,
delays that reorder, symmetric, one-way and random partitions, crashes and
restarts, death notices, leadership transfers) with clients writing all along
(``storage.raft.sim.random_scenario``); ``SafetyChecker`` checks Raft's
invariants after every tick, then the healed group must elect a leader and
commit on every node within a bound. Scripted runs cover what random ones
rarely hit (a leader cut off in a minority, a leader that can hear but not
speak, a lost majority, Raft's figure 8), and mutation tests patch classic
Raft bugs into ``RaftNode`` to show the checker catches each.

CI runs 400 seeds x 200 ticks (about 10 s). Scale it with environment variables:

    RAYMQ_RAFT_SEEDS=20000 python -m pytest tests/storage/test_raft_sim.py -q
    RAYMQ_RAFT_SEED_START=20000 RAYMQ_RAFT_SEEDS=5000 RAYMQ_RAFT_TICKS=1000 python -m pytest ...

A failure names its seed; ``random_scenario(seed, ticks)`` replays it exactly.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import pytest

from storage.raft import RaftConfig, RaftNode, Role
from storage.raft import node as raft_node
from storage.raft.sim import (
    Faults,
    SafetyViolation,
    SimCluster,
    random_scenario,
    ticks_to_new_leader,
)

SEEDS = int(os.environ.get("RAYMQ_RAFT_SEEDS", "400"))
SEED_START = int(os.environ.get("RAYMQ_RAFT_SEED_START", "0"))
TICKS = int(os.environ.get("RAYMQ_RAFT_TICKS", "200"))
CHUNK = 50
SEED_CHUNKS = [
    range(start, min(start + CHUNK, SEED_START + SEEDS))
    for start in range(SEED_START, SEED_START + SEEDS, CHUNK)
]


@pytest.mark.parametrize("seeds", SEED_CHUNKS, ids=lambda r: f"seeds-{r.start}-{r.stop - 1}")
def test_random_scenarios_stay_safe_and_recover_once_healed(seeds: range) -> None:
    for seed in seeds:
        try:
            random_scenario(seed, TICKS)
        except Exception as e:
            raise AssertionError(f"replay with random_scenario({seed}, {TICKS})") from e


def test_a_seed_replays_exactly() -> None:
    a, b = random_scenario(7, 150), random_scenario(7, 150)
    assert a.checker.committed == b.checker.committed and a.describe() == b.describe()
    assert len(a.checker.committed) > 10


def run_until_leader(cluster: SimCluster, max_ticks: int = 1000) -> str:
    for _ in range(max_ticks):
        cluster.run(1)
        leader = cluster.leader()
        if leader is not None and all(cluster.nodes[i].leader_id == leader for i in cluster.alive):
            return leader
    raise AssertionError(f"no leader in {max_ticks} ticks: {cluster.describe()}")


def cut_between(cluster: SimCluster, side: set[str]) -> None:
    other = set(cluster.ids) - side
    cluster.blocked = {(a, b) for a in side for b in other} | {(b, a) for a in side for b in other}


def test_a_leader_cut_off_in_a_minority_commits_nothing_while_the_majority_moves_on() -> None:
    cluster = SimCluster(5, 1, faults=Faults(max_delay=2))
    old = run_until_leader(cluster)
    old_term = cluster.nodes[old].term
    cut_between(cluster, {old, next(i for i in cluster.ids if i != old)})
    stale = cluster.client_write(old)
    assert stale is not None
    cluster.run(100)
    new = cluster.leader()
    assert new is not None and new != old and cluster.nodes[new].term > old_term
    assert cluster.nodes[old].role is not Role.LEADER  # it heard from no quorum
    committed = cluster.checker.committed
    assert all(i > len(committed) or committed[i - 1].term != stale.term for i in stale.indexes)
    cluster.check_liveness()


def test_a_leader_that_can_hear_but_not_speak_is_replaced() -> None:
    cluster = SimCluster(3, 2, faults=Faults(max_delay=2, propose=0.5))
    old = run_until_leader(cluster)
    cluster.blocked = {(old, i) for i in cluster.ids if i != old}
    cluster.run(100)
    new = cluster.leader()
    assert new is not None and new != old
    cluster.check_liveness()


def test_a_group_that_lost_its_majority_commits_nothing_until_it_is_back() -> None:
    cluster = SimCluster(3, 3, faults=Faults(max_delay=2))
    run_until_leader(cluster)
    cluster.crash("n0")
    cluster.crash("n1")
    committed = len(cluster.checker.committed)
    for _ in range(50):
        cluster.client_write("n2")
        cluster.run(1)
    assert len(cluster.checker.committed) == committed
    cluster.check_liveness()


def run_until(cluster: SimCluster, done: Callable[[], bool], max_ticks: int = 500) -> None:
    for _ in range(max_ticks):
        if done():
            return
        cluster.run(1)
    raise AssertionError(f"condition not reached in {max_ticks} ticks: {cluster.describe()}")


def play_figure_8(cluster: SimCluster) -> tuple[bytes, bytes]:
    """Raft's figure 8 on the simulated network; returns the entries (E, F) at index 1.

    s1 leads term 1 and writes E, cut off; l2 leads term 2 and writes F, cut off,
    and dies; s1 leads again and copies E to c, a majority, and dies before
    writing in its own term; l2 comes back and wins with F, the newer term.
    """
    s1 = run_until_leader(cluster)
    cut_between(cluster, {s1})
    e = cluster.client_write(s1)
    run_until(cluster, lambda: cluster.leader() not in (None, s1))
    l2 = cluster.leader()
    assert e is not None and l2 is not None
    [c] = [i for i in cluster.ids if i not in (s1, l2)]
    cut_between(cluster, {l2})
    f = cluster.client_write(l2)
    assert f is not None and f.first_index == e.first_index == 1
    cluster.crash(l2)
    cluster.blocked.clear()
    run_until(
        cluster, lambda: cluster.nodes[s1].is_leader and cluster.nodes[s1].match_index(c) >= 1
    )
    cluster.crash(s1)  # E is on s1 and c, a majority, and s1 wrote nothing in its term
    cluster.restart(l2)
    run_until(cluster, lambda: cluster.leader() == l2)
    return cluster.logs[s1].view[0].data, cluster.logs[l2].view[0].data


def test_figure_8_an_earlier_terms_entry_on_a_majority_is_not_committed() -> None:
    cluster = SimCluster(3, 0, config=RaftConfig(noop_on_election=False))
    e, f = play_figure_8(cluster)
    assert cluster.checker.committed == []  # E was on a majority, yet never committed
    cluster.check_liveness()
    assert cluster.checker.committed[0].data == f != e  # and F, of a newer term, won


def test_a_death_notice_elects_a_new_leader_faster_than_an_election_timeout() -> None:
    lo = SimCluster().config.election_timeout_ticks[0]
    heartbeat = SimCluster().config.heartbeat_ticks
    told = [ticks_to_new_leader(3, seed) for seed in range(20)]
    untold = [ticks_to_new_leader(3, seed, death_notice=False) for seed in range(20)]
    # pre-vote and vote: two round trips of 1-tick messages, plus the tick that delivers
    # the notice
    assert max(told) == 5 < lo <= statistics.median(untold)
    assert min(untold) >= lo - heartbeat  # without a notice, a timeout must pass
    assert max(ticks_to_new_leader(5, seed) for seed in range(10)) == 5


# -- the harness catches broken nodes (each mutation is a classic Raft bug)


def first_violation(seeds: range) -> SafetyViolation | None:
    for seed in seeds:
        try:
            random_scenario(seed, 200)
        except SafetyViolation as e:
            return e
    return None


def test_the_checker_catches_a_node_that_votes_twice_in_a_term(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vote = RaftNode._on_request_vote

    def forgetful(self: RaftNode, m: raft_node.RequestVote) -> None:
        self._voted_for = None
        self._leader_id = None
        vote(self, m)

    monkeypatch.setattr(RaftNode, "_on_request_vote", forgetful)
    assert first_violation(range(50)) is not None


def test_the_checker_catches_a_candidate_that_wins_without_a_quorum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hasty(self: RaftNode) -> None:
        if sum(self._votes.values()) >= self._quorum - 1:
            if self._role is Role.PRE_CANDIDATE:
                self._start_election(self._campaign_force)
            else:
                self._become_leader()

    monkeypatch.setattr(RaftNode, "_tally", hasty)
    violation = first_violation(range(50))
    assert violation is not None and "two leaders in term" in str(violation)


def test_the_checker_catches_a_follower_that_truncates_matching_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    accept = raft_node.accept_entries

    def truncating(log, commit, m):  # type: ignore[no-untyped-def]
        if commit <= m.prev_index < log.last_index and log.term_at(m.prev_index) == m.prev_term:
            log.truncate_from(m.prev_index + 1)
        return accept(log, commit, m)

    monkeypatch.setattr(raft_node, "accept_entries", truncating)
    assert first_violation(range(50)) is not None


def test_the_checker_catches_a_follower_that_trusts_the_leaders_commit_index_blindly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_append = RaftNode._on_append_entries

    def credulous(self: RaftNode, m: raft_node.AppendEntries) -> None:
        on_append(self, m)
        if self._leader_id == m.src:
            self._commit = max(self._commit, min(m.leader_commit, self._log.last_index))

    monkeypatch.setattr(RaftNode, "_on_append_entries", credulous)
    assert first_violation(range(50)) is not None


def test_the_checker_catches_a_leader_that_commits_earlier_terms_by_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def counting(self: RaftNode) -> None:
        if self._replicator is not None:
            self._commit = max(self._commit, self._replicator.quorum_index())

    monkeypatch.setattr(RaftNode, "_maybe_commit", counting)
    with pytest.raises(SafetyViolation, match=r"\(leadership of term \d+\) differs"):
        play_figure_8(SimCluster(3, 0, config=RaftConfig(noop_on_election=False)))

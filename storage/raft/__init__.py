"""The consensus core of RayMQ's DLedger mode: Raft as a pure state machine.

A DLedger group is a few Broker actors that keep one replicated CommitLog: one
leader (the master) takes writes, and a write is acknowledged once a majority
holds it. This package is that group's brain. ``RaftNode`` has no thread, clock
or I/O of its own, and never imports Ray: the Broker actor (the shell) feeds it
ticks, messages, proposals and death notices and carries out what it asks, so
the same code runs in a deterministic simulated network in the tests
(``storage.raft.sim``).

Invariants (checked after every step of thousands of simulated runs with drops,
delays, duplicates, reordering, partitions, crashes and restarts):

* Election safety: at most one leader per term.
* Log matching: if two logs hold an entry with the same index and term, they
  are identical up to that index.
* Leader completeness: an entry committed in a term is in the log of every
  leader of that term and of every later one.
* State machine safety: an index, once reported committed by any node, holds
  the same entry on every node that ever reports it, and no node truncates an
  entry at or below its own commit index. So an acknowledged write is never
  lost or changed, and a leader of an older term can never get a write
  acknowledged.
* Persistent state: a node's term never decreases and it votes at most once
  per term.

Driving a node (the shell's contract)::

    node = RaftNode("broker-a-0", ["broker-a-0", "broker-a-1", "broker-a-2"],
                    log=commitlog_backed_log,          # a RaftLog; see log.py
                    hard_state=persisted_hard_state,   # (term, voted_for), or None at first
                    applied_index=dispatched_index,    # how far the store has applied
                    rng=random.Random())
    # on a timer (say every 100 ms):  node.tick()
    # on a message from a peer:       node.receive(msg)
    # on a client batch:              proposal = node.propose([batch])  # or NotLeaderError
    # on a Ray death notice:          node.on_peer_dead(peer)
    # after any of these:
    ready = node.ready()
    if ready.must_sync:                  # 1. persist, BEFORE anything is sent:
        save(ready.hard_state)           #    term and vote, if changed
        sync_log()                       #    log_truncated_from / log_appended
    for msg in ready.messages:           # 2. send (Ray calls to the peers' actors)
        send(msg)
    for index in ready.committed:        # 3. apply in order (dispatch to ConsumeQueue), and
        apply(index)                     #    acknowledge proposals committed with their term

A vote or an acknowledgement sent before the state it promises is durable
could elect two leaders or lose a committed write after a crash. The commit
index needs no sync of its own: after a crash the shell passes its durable
``applied_index`` and committed entries past it are reported again. After a
crash the shell builds a new node from what it persisted (or, in tests, calls
``restart()`` on the old one).

Modules: ``node`` (the role state machine: elections, terms, votes),
``replication`` (the leader's per-follower flow control and the follower's log
checks), ``log`` (the ``RaftLog`` interface), ``messages``, ``ready`` (what
the shell receives), ``config``; ``sim`` and ``invariants`` are the simulated
network and the safety checker the tests (and benchmarks) use.
"""

from .config import RaftConfig
from .errors import NotLeaderError, RaftError, RaftSafetyError
from .log import InMemoryRaftLog, RaftLog
from .messages import (
    AppendEntries,
    AppendEntriesResponse,
    Entry,
    Message,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from .node import RaftNode
from .ready import HardState, Proposal, Ready, Role, SoftState

__all__ = [
    "AppendEntries",
    "AppendEntriesResponse",
    "Entry",
    "HardState",
    "InMemoryRaftLog",
    "Message",
    "NodeId",
    "NotLeaderError",
    "Proposal",
    "RaftConfig",
    "RaftError",
    "RaftLog",
    "RaftNode",
    "RaftSafetyError",
    "Ready",
    "RequestVote",
    "RequestVoteResponse",
    "Role",
    "SoftState",
    "TimeoutNow",
]

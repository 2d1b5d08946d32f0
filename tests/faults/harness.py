"""Real Ray nodes on this one machine, and the faults a network and a kernel can do to them.

A :class:`FaultLab` is a few Ray nodes, each in a network namespace of its own
(``rmqf-<node>``), joined by veth pairs to one bridge (``rmqf-br``) in the private range
``10.77.0.0/24``, which exists only inside the namespaces the lab makes: the host gets no
address on the bridge and nothing is routed out of it. The first node runs ``ray start
--head``, the others join it; each carries the custom resource ``node-<name>`` and keeps
its Ray session and stores in its own directory. Every Ray process runs with one random
cluster token (``RAY_AUTH_MODE=token``), so no ``~/.ray/auth_token`` is read or written.

Faults: :meth:`FaultLab.partition` drops traffic between sets of nodes with one nftables
``inet`` table per namespace (:meth:`FaultLab.drop_one_way`: one direction only),
:meth:`FaultLab.degrade` delays and drops packets (``tc netem``), :meth:`FaultLab.heal`
removes both; :meth:`FaultLab.pause`,
:meth:`FaultLab.resume` and :meth:`FaultLab.kill` signal processes found inside a node's
namespace (a broker is found by its Ray process title).

What the lab made it takes down on exit, failed run or not: every process in its
namespaces (killed by pid, found with ``ip netns pids``: never a machine-wide ``ray
stop``), the namespaces (and with them their veths and nft tables), the bridge and its
directory. A lab that finds another's leftovers by name at start (a crashed run) removes
them first; a lock on ``/run/rmqf.lock`` keeps two labs on one machine apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("raymq.tests.faults.harness")

PREFIX = "rmqf"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.77.0"
LOCK = Path("/run") / f"{PREFIX}.lock"
GCS_PORT = 6379
REPO = Path(__file__).resolve().parents[2]
TOOLS = ("ip", "nft", "tc")


class LabError(RuntimeError):
    """The lab could not be built or a fault could not be injected."""


def missing_tools() -> list[str]:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [t for t in TOOLS if shutil.which(t, path=path) is None]


def can_admin_network() -> bool:
    """True when this process may make network namespaces (root with CAP_NET_ADMIN)."""
    if os.geteuid() != 0:
        return False
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 12))  # CAP_NET_ADMIN
    return False


def _run(*argv: str, check: bool = True, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _namespaces() -> list[str]:
    out = _run("ip", "-json", "netns", "list", check=False).strip()
    return [n["name"] for n in json.loads(out or "[]")]


def _pids_in(netns: str) -> list[int]:
    out = _run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in out.split()]


def _kill_namespace(netns: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pids := _pids_in(netns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused process dies only once resumed
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise LabError(f"processes left in {netns} after {timeout_s}s: {pids}")
        time.sleep(0.1)


def _links() -> list[str]:
    return [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"{PREFIX}-")]


def sweep(timeout_s: float = 30.0) -> None:
    """Remove what any lab left on this machine: its namespaces and their processes, its
    veths and bridge. A namespace's veth outlives ``ip netns del`` for a moment (the
    kernel frees it later), so the veths go by name and the sweep waits for them."""
    for netns in _namespaces():
        if netns.startswith(f"{PREFIX}-"):
            _kill_namespace(netns)
    for link in _links():
        _run("ip", "link", "del", link, check=False)
    for netns in _namespaces():
        if netns.startswith(f"{PREFIX}-"):
            _run("ip", "netns", "del", netns, check=False)
    deadline = time.monotonic() + timeout_s
    while left := _links():
        if time.monotonic() > deadline:
            raise LabError(f"links left after {timeout_s}s: {left}")
        time.sleep(0.05)


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


@dataclass
class Node:
    """One Ray node: its namespace, its address on the bridge, its directory."""

    name: str
    ip: str
    dir: Path
    head: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ray_start: subprocess.Popen[bytes] | None = None  # its `ray start --block`

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def resource(self) -> str:
        """The custom resource only this node has: place a broker here with it."""
        return f"node-{self.name}"

    def pids(self) -> dict[int, str]:
        """pid -> command line of every process inside the node's namespace."""
        return {pid: _cmdline(pid) for pid in _pids_in(self.netns)}

    def actor_pids(self, class_name: str) -> list[int]:
        """Processes of the node running an actor of that class (Ray titles its worker
        ``ray::<Class>`` or ``ray::<Class>.<method>``)."""
        return [
            pid
            for pid, cmd in self.pids().items()
            if cmd.startswith((f"ray::{class_name} ", f"ray::{class_name}."))
            or cmd == f"ray::{class_name}"
        ]

    def log_dir(self) -> Path:
        return self.dir / "ray" / "session_latest" / "logs"


class FaultLab:
    """Ray nodes in network namespaces, and faults between them (a context manager)."""

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        root: Path | None = None,
        cpus: dict[str, float] | None = None,
        object_store_mb: int = 80,
        ray: bool = True,
        keep: bool = False,
        ray_env: dict[str, str] | None = None,
    ) -> None:
        if not 1 <= len(nodes) <= 200 or len(set(nodes)) != len(nodes):
            raise LabError(f"nodes={list(nodes)!r}: 1..200 distinct names")
        self.token = secrets.token_hex(32)
        self.object_store_mb = object_store_mb
        self.with_ray = ray
        self.keep = keep
        self._ray_env = dict(ray_env or {})
        self._root_given = root
        self.root = Path(".")
        self._names = list(nodes)
        self._cpus = cpus or {}
        self.nodes: dict[str, Node] = {}
        self._lock: IO[str] | None = None
        self._stack = contextlib.ExitStack()
        self._agent: subprocess.Popen[bytes] | None = None  # head_agent.py: asks the GCS

    # --- building -----------------------------------------------------------------

    def __enter__(self) -> FaultLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        if not can_admin_network():
            raise LabError("needs root with CAP_NET_ADMIN: it makes network namespaces")
        if missing := missing_tools():
            raise LabError(f"missing tools {missing}: apt-get install iproute2 nftables")
        lock = LOCK.open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another lab on this machine: wait for it
        except BaseException:  # interrupted while waiting: the other lab's is not ours
            lock.close()
            raise
        self._lock = lock  # from here on what rmqf-* holds is this lab's to take down
        sweep()
        # short: Ray's socket paths under the session dir must fit in 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-", dir=self._root_given or "/tmp"))
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "link", "set", BRIDGE, "up")
        for i, name in enumerate(self._names):
            node = Node(name, f"{SUBNET}.{10 + i}", self.root / name, head=i == 0)
            node.dir.mkdir()
            self._add_namespace(node, i)
            self.nodes[name] = node
        if self.with_ray:
            # one node at a time: a raylet that has not registered with the GCS 30 s after
            # its `ray start` began makes that start give up (a bound Ray hard-codes), and
            # four nodes' processes starting at once on two cores took longer than that
            for node in self.nodes.values():
                self._start_ray(node)
                if not node.head:
                    self._wait_started(node)
            self.wait_for_nodes(len(self.nodes))

    def _add_namespace(self, node: Node, index: int) -> None:
        outside = f"{PREFIX}-v{index}"
        _run("ip", "netns", "add", node.netns)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0",
             "netns", node.netns)  # fmt: skip
        _run("ip", "link", "set", outside, "master", BRIDGE, "up")
        self.ns_exec(node, "ip", "addr", "add", f"{node.ip}/24", "dev", "eth0")
        self.ns_exec(node, "ip", "link", "set", "eth0", "up")
        self.ns_exec(node, "ip", "link", "set", "lo", "up")

    def ns_exec(self, node: Node, *argv: str, stdin: str | None = None) -> str:
        return _run("ip", "netns", "exec", node.netns, *argv, stdin=stdin)

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes.values() if n.head)

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    def env(self) -> dict[str, str]:
        """The environment of every process of the lab's cluster: its token, this checkout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        path = [str(REPO), str(REPO / "tests" / "faults")]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            PYTHONPATH=os.pathsep.join(path),
            RAY_USAGE_STATS_ENABLED="0",
        )
        env.update(self._ray_env)  # e.g. the GCS's health checks, to give a crashed node up sooner
        return env

    def popen(self, node: Node, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a process inside the node's namespace (its own session), as the lab's."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, *argv],
            env=kwargs.pop("env", self.env()),
            cwd=kwargs.pop("cwd", str(REPO)),
            start_new_session=True,
            **kwargs,
        )
        node.procs.append(proc)
        return proc

    def _start_ray(self, node: Node) -> None:
        role = (
            ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
            if node.head
            else [f"--address={self.address}"]
        )
        argv = [
            sys.executable, "-m", "ray.scripts.scripts", "start", *role, "--block",
            f"--node-ip-address={node.ip}",
            f"--num-cpus={self._cpus.get(node.name, 1)}",
            f"--resources={json.dumps({node.resource: 1})}",
            f"--temp-dir={node.dir / 'ray'}",
            f"--object-store-memory={self.object_store_mb << 20}",
            "--disable-usage-stats",
        ]  # fmt: skip
        log = (node.dir / "ray-start.log").open("wb")
        self._stack.callback(log.close)
        node.ray_start = self.popen(
            node, argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        if node.head:
            self.wait_for_nodes(1)

    def _wait_started(self, node: Node, timeout_s: float = 120.0) -> None:
        """Wait until a worker's ``ray start`` says its node joined (its raylet registered
        with the GCS), starting it again if it gave up: read from its log, which costs
        nothing, where asking the head costs a driver's start."""
        log_path = node.dir / "ray-start.log"
        deadline = time.monotonic() + timeout_s
        tries = 1
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if "Ray runtime started" in log_path.read_text(errors="replace"):
                    return
            proc = node.ray_start
            if proc is not None and proc.poll() is not None:
                if tries >= 3:
                    raise LabError(
                        f"ray on {node.name} exited {proc.returncode} {tries} times:\n"
                        + log_path.read_text(errors="replace")[-3000:]
                    )
                tries += 1
                log.warning(
                    "ray start on %s exited %s: starting it again", node.name, proc.returncode
                )
                self.crash(node.name)
                self._start_ray(node)
            time.sleep(0.1)
        raise LabError(f"ray on {node.name} did not start in {timeout_s}s")

    def alive_nodes(self) -> int:
        """How many Ray nodes the head counts alive."""
        return len(self.alive_ips())

    def alive_ips(self) -> list[str]:
        """The addresses of the Ray nodes the head counts alive."""
        return list(self._ask("nodes"))

    def _ask(self, question: str, timeout_s: float = 30.0) -> Any:
        """``head_agent.py``'s answer to ``question`` (``nodes``, ``actors``), asked of
        the GCS from the head's namespace by one process kept for the lab's life (a Ray
        driver per question cost seconds each). Started again once if it died or did not
        answer; its error raises :class:`LabError`."""
        for attempt in (1, 2):
            agent = self._agent
            if agent is None or agent.poll() is not None:
                agent = self._agent = subprocess.Popen(
                    ["ip", "netns", "exec", self.head.netns, sys.executable,
                     str(Path(__file__).with_name("head_agent.py")), self.address],
                    env=self.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            assert agent.stdin is not None and agent.stdout is not None
            try:
                agent.stdin.write(question.encode() + b"\n")
                agent.stdin.flush()
                ready, _, _ = select.select([agent.stdout], [], [], timeout_s)
                line = agent.stdout.readline() if ready else b""
            except OSError:
                line = b""
            if line:
                answer = json.loads(line)
                if isinstance(answer, dict) and "error" in answer:
                    raise LabError(f"the GCS did not answer {question!r}: {answer['error']}")
                return answer
            self._stop_agent()
            if attempt == 2:
                raise LabError(f"no answer to {question!r} from the head in {timeout_s}s")
        raise AssertionError("unreachable")

    def _stop_agent(self) -> None:
        agent, self._agent = self._agent, None
        if agent is not None:
            with contextlib.suppress(Exception):
                agent.kill()
                agent.wait(timeout=10)
            for pipe in (agent.stdin, agent.stdout):
                with contextlib.suppress(Exception):
                    if pipe is not None:
                        pipe.close()

    def wait_for_nodes(self, count: int, timeout_s: float = 90.0) -> None:
        """Wait until ``count`` nodes are alive in the head's view."""
        deadline = time.monotonic() + timeout_s
        alive, last = 0, ""
        starts: dict[str, int] = {}
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                for p in node.procs:
                    if p.poll() is None:
                        continue
                    if p is node.ray_start and not node.head and starts.get(node.name, 0) < 3:
                        # a worker node's `ray start` gives up after 30 s when the GCS
                        # answers late (a loaded machine, or four nodes joining at once on
                        # two cores): the lab's own step, tried again, each node up to three
                        # times, with the time the new try takes added to the wait
                        starts[node.name] = starts.get(node.name, 0) + 1
                        log.warning(
                            "ray start on %s exited %s: starting it again", node.name, p.returncode
                        )
                        self.crash(node.name)
                        self._start_ray(node)
                        # ray start gives up at 30 s; its raylet may then take as long
                        # again to show alive in the head's view (CI on 36c919c: 45 s
                        # after a second start on a quiet machine were not enough)
                        deadline = max(deadline, time.monotonic() + 75.0)
                        break
                    raise LabError(
                        f"ray on {node.name} exited {p.returncode}:\n"
                        + (node.dir / "ray-start.log").read_text()[-3000:]
                    )
            try:
                alive = self.alive_nodes()
            except LabError as exc:
                last = str(exc)
            else:
                if alive >= count:
                    return
            time.sleep(0.2)
        raise LabError(f"{alive} of {count} Ray nodes up after {timeout_s}s: {last}")

    def close(self) -> None:
        """Take down everything the lab made (safe to call twice, and after a failed build).
        A lab that never held the lock made nothing: the namespaces there are another
        lab's, left alone."""
        if self._lock is None:
            return
        try:
            self._stop_agent()
            for node in self.nodes.values():
                with contextlib.suppress(LabError):
                    _kill_namespace(node.netns)
                for p in node.procs:
                    with contextlib.suppress(Exception):
                        p.kill()
                        p.wait(timeout=10)
            sweep()
            self._stack.close()
            if self.root != Path(".") and not self.keep:
                shutil.rmtree(self.root, ignore_errors=True)
        finally:
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def reuse(self) -> str | None:
        """Make the lab what it was once built, for another test: every cut and delay
        healed, nothing left paused, every process a test started killed, each node's
        files but Ray's removed (stores, workload logs). Returns why it cannot be
        reused (a node down, an actor left alive), or None when it can; a lab that
        cannot is for :meth:`close`."""
        self.heal()
        for node in self.nodes.values():
            for pid in _pids_in(node.netns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            for p in [p for p in node.procs if p is not node.ray_start]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)  # its own session (popen)
                with contextlib.suppress(Exception):
                    p.wait(timeout=10)
                node.procs.remove(p)
            if node.ray_start is None or node.ray_start.poll() is not None:
                return f"Ray on {node.name} is not running"
        try:
            alive, named = self.alive_nodes(), self._ask("actors")
        except LabError as exc:
            return f"could not ask the head: {exc}"
        if alive != len(self.nodes):
            return f"{alive} of {len(self.nodes)} Ray nodes alive"
        if named:
            return f"actors left alive: {named[:10]}"
        for node in self.nodes.values():
            for path in node.dir.iterdir():
                if path.name in ("ray", "ray-start.log"):
                    continue
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        return None

    # --- faults ---------------------------------------------------------------------

    def partition(self, *sides: Iterable[str]) -> None:
        """Cut every node of one side off from every node of the others (both ways), on
        top of any cut already made. ``partition(["b"], ["c"])`` isolates b from c; nodes
        named on no side keep talking to everyone."""
        groups = [[self.nodes[n] for n in side] for side in sides]
        for i, group in enumerate(groups):
            others = [n.ip for j, g in enumerate(groups) if j != i for n in g]
            for node in group:
                self._drop(node, others)

    def drop_one_way(self, src: str, dst: str) -> None:
        """Drop what ``src`` sends to ``dst``; what ``dst`` sends to ``src`` still arrives
        (a TCP connection between them stalls both ways, a datagram gets through one way)."""
        self._drop(self.nodes[dst], [self.nodes[src].ip], outbound=False)

    def _drop(self, node: Node, peers: list[str], *, outbound: bool = True) -> None:
        if not peers:
            return
        addrs = ", ".join(peers)
        t = f"inet {PREFIX}"
        rules = (
            f"add table {t}\n"
            f"add chain {t} input {{ type filter hook input priority -10; policy accept; }}\n"
            f"add chain {t} output {{ type filter hook output priority -10; policy accept; }}\n"
            f"add rule {t} input ip saddr {{ {addrs} }} drop\n"
        )
        if outbound:
            rules += f"add rule {t} output ip daddr {{ {addrs} }} drop\n"
        self.ns_exec(node, "nft", "-f", "-", stdin=rules)

    def degrade(self, node: str, delay_ms: int, jitter_ms: int = 0, loss_pct: float = 0.0) -> str:
        """Make the node's link slow and lossy: ``tc netem`` delays every packet it sends
        by ``delay_ms`` (± ``jitter_ms``) and drops ``loss_pct`` percent of them. A kernel
        without netem (``sch_netem``) gets the nearest it has: an nftables rule dropping
        that share of the node's packets at random, and a ``tbf`` rate limit whose queue
        holds a packet up to ``delay_ms`` (a slow link's delay, under load only). Returns
        which of the two was applied."""
        n = self.nodes[node]
        argv = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
                "delay", f"{delay_ms}ms", f"{jitter_ms}ms"]  # fmt: skip
        if loss_pct:
            argv += ["loss", f"{loss_pct:g}%"]
        try:
            self.ns_exec(n, *argv)
            return "netem"
        except LabError as exc:
            if "unknown" not in str(exc):
                raise
        if loss_pct:
            t = f"inet {PREFIX}"
            share = "" if loss_pct >= 100 else f"numgen random mod 10000 < {round(loss_pct * 100)}"
            self.ns_exec(n, "nft", "-f", "-", stdin=(
                f"add table {t}\n"
                f"add chain {t} output {{ type filter hook output priority -10; policy accept; }}\n"
                f"add rule {t} output {share} drop\n"
            ))  # fmt: skip
        if delay_ms:
            rate = "1mbit" if delay_ms >= 100 else "10mbit"
            self.ns_exec(n, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                         "rate", rate, "burst", "16kb", "latency", f"{delay_ms}ms")  # fmt: skip
        return "nft+tbf"

    def heal(self) -> None:
        """Remove every cut and every ``degrade``: each namespace's table and qdisc go."""
        for node in self.nodes.values():
            with contextlib.suppress(LabError):
                self.ns_exec(node, "nft", "delete", "table", "inet", PREFIX)
            with contextlib.suppress(LabError):
                shown = self.ns_exec(node, "tc", "qdisc", "show", "dev", "eth0")
                if "netem" in shown or "tbf" in shown:
                    self.ns_exec(node, "tc", "qdisc", "del", "dev", "eth0", "root")

    def rules(self, node: str) -> str:
        """The node's nft ruleset as nft lists it (what a partition made)."""
        return self.ns_exec(self.nodes[node], "nft", "list", "ruleset")

    def _own(self, node: str, pids: Iterable[int]) -> list[int]:
        inside = set(_pids_in(self.nodes[node].netns))
        pids = list(pids)
        if stray := [p for p in pids if p not in inside]:
            raise LabError(f"pids {stray} are not in node {node}'s namespace")
        return pids

    def pause(self, node: str, pids: Iterable[int]) -> None:
        """SIGSTOP those processes of the node (a GC pause, VM steal)."""
        for pid in self._own(node, pids):
            os.kill(pid, signal.SIGSTOP)

    def resume(self, node: str, pids: Iterable[int]) -> None:
        for pid in self._own(node, pids):
            os.kill(pid, signal.SIGCONT)

    def kill(self, node: str, pids: Iterable[int]) -> None:
        """SIGKILL those processes of the node (a crashed broker)."""
        for pid in self._own(node, pids):
            os.kill(pid, signal.SIGKILL)

    def crash(self, node: str) -> None:
        """SIGKILL every process of the node, its raylet and workers with it (a machine
        that loses power: what its files hold is what the page cache had written)."""
        n = self.nodes[node]
        _kill_namespace(n.netns)
        for p in n.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        n.procs.clear()

    def restart(self, node: str, timeout_s: float = 90.0) -> None:
        """Start Ray on a crashed (non-head) node again, in its namespace with its
        resource and directory, once the GCS has given the crashed one up (its health
        checks, ``RAY_health_check_*`` in ``ray_env``, decide how soon); returns when
        the new node is alive."""
        self.restart_nodes([node], timeout_s)

    def restart_nodes(self, nodes: Sequence[str], timeout_s: float = 90.0) -> None:
        """:meth:`restart` for several crashed nodes at once."""
        if any(self.nodes[n].head for n in nodes):
            raise LabError("the head node cannot be restarted: the GCS lives there")
        deadline = time.monotonic() + timeout_s
        while (alive := self.alive_nodes()) > len(self.nodes) - len(nodes):
            if time.monotonic() > deadline:
                raise LabError(f"the GCS still counts {alive} nodes alive after {timeout_s}s")
            time.sleep(0.2)
        for n in nodes:
            self._start_ray(self.nodes[n])
        self.wait_for_nodes(len(self.nodes), max(1.0, deadline - time.monotonic()))


@contextlib.contextmanager
def fault_lab(nodes: Sequence[str], **options: Any) -> Iterator[FaultLab]:
    with FaultLab(nodes, **options) as lab:
        yield lab

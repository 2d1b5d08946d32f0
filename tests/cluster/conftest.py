"""Sandboxed "remote" nodes on this machine for the cluster launcher's end-to-end test.

``loopback_cluster`` gives a head and a worker. Each node is an sshd on its own loopback
address (127.0.0.1, 127.0.0.2) inside its own PID and mount namespaces (``unshare``):
everything started over SSH (``ray stop``, ``ray start``, ``pip install``) sees only that
node's processes, writes the user's home into a throw-away overlay, keeps Ray's
``/tmp/ray`` in the test's directory and has the node's own disk at ``/data/raymq`` (a
directory of the test bound there), so cluster.yaml's paths stay as they are. So
``ray up``/``ray down``, which run ``ray stop`` on the nodes, cannot touch any other
Ray on the machine. ``sentinel_ray`` is such another Ray, started beforehand, to
prove it.

The nodes share the machine's network namespace and their sshds listen on free ports,
so each ssh client is told where a node's sshd is, as a real network would have it at
port 22 of the node's address. The launcher on this machine gets one ``ProxyCommand``
(its single ``auth`` section serves every node) that sends each connection to the sshd
of the address ssh was asked for. Ray drops the proxy from the config it gives the head
(a head reaches its workers directly), so the head's autoscaler finds the worker's port
in the ``~/.ssh/config`` of the head's sandboxed home.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TOOLS = ("sshd", "ssh", "ssh-keygen", "rsync", "unshare")
APT_PACKAGES = ("openssh-server", "openssh-client", "rsync")
HEAD_IP, WORKER_IP = "127.0.0.1", "127.0.0.2"
# The store disk every node has in cluster.yaml; each sandboxed node gets its own.
DATA_DIR = Path("/data/raymq")

# ssh's ProxyCommand: stdin/stdout <-> one TCP connection to the sshd of the node ssh
# was asked for. Ray's rsync splits its ssh options on spaces, so the command is a
# script path with no arguments (not even ssh's %h); the proxy finds the destination in
# its parent's command line, the ssh that runs it (`sh -c "exec <script>"`, and the
# script execs this): ssh's first argument that is not an option or an option's value.
_PROXY = """\
import os, socket, sys, threading
PORTS = {ports!r}
WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")  # ssh's options that take a value
with open(f"/proc/{{os.getppid()}}/cmdline", "rb") as f:
    argv = f.read().decode().split("\\0")
args, dest = iter(argv[1:]), None
for arg in args:
    if arg.startswith("-") and len(arg) > 1:
        for i, letter in enumerate(arg[1:], 1):
            if letter in WITH_VALUE:
                if i == len(arg) - 1:
                    next(args, None)
                break
        continue
    dest = arg.rpartition("@")[2]
    break
if dest not in PORTS:
    sys.exit(f"proxy: ssh to {{dest!r}} is to no sandboxed node {{sorted(PORTS)}}: {{argv}}")
conn = socket.create_connection((dest, PORTS[dest]))
def upstream():
    while data := os.read(0, 65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
threading.Thread(target=upstream, daemon=True).start()
out = sys.stdout.buffer
while data := conn.recv(65536):
    out.write(data)
    out.flush()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_tools() -> None:
    if all(shutil.which(t, path=os.environ["PATH"] + ":/usr/sbin:/sbin") for t in TOOLS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"needs {', '.join(APT_PACKAGES)} and cannot apt-get install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES],
    ):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"`{' '.join(cmd)}` failed: {done.stderr[-500:]}")


def _pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


@dataclass
class LoopbackNode:
    """One sandboxed node: where to reach it, its disk, and what runs in it."""

    ip: str
    dir: Path
    port: int
    data: Path  # what the node sees at /data/raymq
    namespace: str
    log: Path

    @property
    def ray_logs(self) -> Path | None:
        """Ray's logs of the node's current session (its /tmp/ray is ray-tmp, where
        session_latest links to the node's /tmp/ray/<session>)."""
        try:
            session = Path(os.readlink(self.dir / "ray-tmp" / "session_latest")).name
        except OSError:
            return None
        return self.dir / "ray-tmp" / session / "logs"

    def processes(self) -> dict[int, str]:
        """pid -> command name of every process inside the node's PID namespace."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns/pid") == self.namespace:
                    found[int(entry.name)] = (entry / "comm").read_text().strip()
            except OSError:
                continue
        return found

    def command_lines(self) -> dict[int, str]:
        """pid -> command line of every process inside the node's PID namespace."""
        found = {}
        for pid in self.processes():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                found[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        return found


@dataclass
class LoopbackCluster:
    """A head and a worker, reached as one SSH user with one key through one proxy."""

    dir: Path
    head: LoopbackNode
    worker: LoopbackNode
    ssh_user: str
    ssh_private_key: Path
    proxy_command: Path

    @staticmethod
    def free_port() -> int:
        return free_port()


def _start_namespace(
    tmp: Path, ip: str, ports: dict[str, int]
) -> tuple[subprocess.Popen[bytes], Path]:
    home = Path(pwd.getpwuid(os.geteuid()).pw_dir)  # where sshd logs the user in
    sshd = shutil.which("sshd", path=os.environ["PATH"] + ":/usr/sbin:/sbin")
    (tmp / "sshd_config").write_text(
        textwrap.dedent(f"""\
        Port {ports[ip]}
        ListenAddress {ip}
        HostKey {tmp}/host_key
        PidFile none
        AuthorizedKeysFile {tmp}/authorized_keys
        PermitRootLogin prohibit-password
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        StrictModes no
        PrintMotd no
        Subsystem sftp internal-sftp
        """)
    )
    # Inside the new namespaces: the home directory becomes an overlay on a tmpfs (so
    # `pip install -e`, the rsync'ed checkout and ~/ray_bootstrap_config.yaml vanish
    # with the namespace), ssh from the node finds every node's sshd, /tmp/ray becomes
    # the test's own directory, /data/raymq the node's own disk, then sshd becomes PID 1:
    # when it dies, the kernel kills everything the test started in there.
    (tmp / "ssh_config").write_text(
        "".join(f"Host {host}\n    Port {port}\n" for host, port in ports.items())
    )
    (tmp / "init.sh").write_text(
        textwrap.dedent(f"""\
        set -eu
        mkdir -p {tmp}/overlay {tmp}/ray-tmp {tmp}/data /tmp/ray /run/sshd
        mount -t tmpfs -o size=4g raymq-test {tmp}/overlay
        mkdir {tmp}/overlay/upper {tmp}/overlay/work
        mount -t overlay raymq-test \\
            -o lowerdir={home},upperdir={tmp}/overlay/upper,workdir={tmp}/overlay/work {home}
        mkdir -p {home}/.ssh && touch {home}/.ssh/config
        cat {tmp}/ssh_config {home}/.ssh/config > {tmp}/ssh_config.merged
        install -m 600 {tmp}/ssh_config.merged {home}/.ssh/config
        mount --bind {tmp}/ray-tmp /tmp/ray
        mount --bind {tmp}/data {DATA_DIR}
        exec {sshd} -D -e -f {tmp}/sshd_config
        """)
    )
    log = tmp / "sshd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount"]
            + ["--propagation", "private", "bash", str(tmp / "init.sh")],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def _wait_for_ssh(proc: subprocess.Popen[bytes], ip: str, port: int, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd namespace exited {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection((ip, port), timeout=2) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"sshd did not answer on {ip}:{port}:\n{log.read_text()}")


def _stop_namespace(proc: subprocess.Popen[bytes], node: LoopbackNode | None) -> None:
    # unshare ignores SIGTERM while it waits; SIGKILL makes --kill-child kill sshd (PID 1
    # of the namespace), and the kernel then kills the rest of the namespace.
    proc.kill()
    proc.wait(timeout=30)
    if node is None:
        return
    deadline = time.monotonic() + 30
    while (left := node.processes()) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    assert not node.processes(), f"processes left in the test's namespace: {node.processes()}"


@contextlib.contextmanager
def _mount_point(path: Path) -> Iterator[None]:
    """``path`` exists while the nodes bind their disks on it (in their own mount
    namespaces: the machine's ``path`` and whatever is in it stay untouched); what this
    created is removed afterwards."""
    created = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        for p in created:  # deepest first
            with contextlib.suppress(OSError):
                p.rmdir()


@contextlib.contextmanager
def _node(tmp: Path, ip: str, ports: dict[str, int]) -> Iterator[LoopbackNode]:
    shutil.copy(tmp.parent / "client_key.pub", tmp / "authorized_keys")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host_key")], check=True
    )
    proc, log = _start_namespace(tmp, ip, ports)
    node = None
    try:
        _wait_for_ssh(proc, ip, ports[ip], log)
        [init] = _children(proc.pid)
        node = LoopbackNode(
            ip=ip,
            dir=tmp,
            port=ports[ip],
            data=tmp / "data",
            namespace=_pid_namespace(init),
            log=log,
        )
        assert node.namespace != _pid_namespace(os.getpid())
        yield node
    finally:
        _stop_namespace(proc, node)


@pytest.fixture
def loopback_cluster(tmp_path: Path) -> Iterator[LoopbackCluster]:
    if os.geteuid() != 0:
        pytest.skip("needs root: PID and mount namespaces, and root login over SSH")
    _ensure_tools()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "client_key")],
        check=True,
    )
    ports = {HEAD_IP: free_port(), WORKER_IP: free_port()}
    (tmp_path / "proxy.py").write_text(_PROXY.format(ports=ports))
    proxy = tmp_path / "proxy.sh"
    proxy.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'proxy.py'}\n")
    proxy.chmod(0o755)
    (tmp_path / "head").mkdir()
    (tmp_path / "worker").mkdir()
    with (
        _mount_point(DATA_DIR),
        _node(tmp_path / "head", HEAD_IP, ports) as head,
        _node(tmp_path / "worker", WORKER_IP, ports) as worker,
    ):
        yield LoopbackCluster(
            dir=tmp_path,
            head=head,
            worker=worker,
            ssh_user="root",
            ssh_private_key=tmp_path / "client_key",
            proxy_command=proxy,
        )


_SENTINEL = """\
import sys
import ray

ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")

@ray.remote
def increment(x):
    return x + 1

print("ready", flush=True)
for line in sys.stdin:
    print(ray.get(increment.remote(int(line))), flush=True)
ray.shutdown()
"""


class SentinelRay:
    """Another Ray instance on this machine, in another process, that must survive."""

    def __init__(self, tmp: Path) -> None:
        script = tmp / "sentinel.py"
        script.write_text(_SENTINEL)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"sentinel Ray did not start (exit {self.proc.poll()})"

    def answers(self, x: int) -> bool:
        """True when the sentinel's Ray still runs a task (x -> x + 1)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is not None:
            return False
        self.proc.stdin.write(f"{x}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip() == str(x + 1)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def sentinel_ray(tmp_path: Path) -> Iterator[SentinelRay]:
    sentinel = SentinelRay(tmp_path)
    try:
        yield sentinel
    finally:
        sentinel.close()

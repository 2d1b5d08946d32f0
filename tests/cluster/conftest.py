"""A sandboxed "remote" node on this machine for the cluster launcher's end-to-end test.

``loopback_node`` runs an sshd on a free loopback port inside its own PID and mount
namespaces (``unshare``): everything started over SSH (``ray stop``, ``ray start``,
``pip install``) sees only that namespace's processes, writes the user's home into a
throw-away overlay, and keeps Ray's ``/tmp/ray`` in the test's directory. So
``ray up``/``ray down``, which run ``ray stop`` on the node, cannot touch any other
Ray on the machine. ``sentinel_ray`` is such another Ray, started beforehand, to
prove it.
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

# ssh's ProxyCommand: stdin/stdout <-> one TCP connection. Ray's rsync splits its ssh
# options on spaces, so the command is a script path with no arguments.
_PROXY = """\
import os, socket, sys, threading
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
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
    """The sandboxed node: where to reach it and what runs in it."""

    dir: Path
    port: int
    ssh_user: str
    ssh_private_key: Path
    proxy_command: Path
    namespace: str
    log: Path

    @staticmethod
    def free_port() -> int:
        return free_port()

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


def _start_namespace(tmp: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    home = Path(pwd.getpwuid(os.geteuid()).pw_dir)  # where sshd logs the user in
    sshd = shutil.which("sshd", path=os.environ["PATH"] + ":/usr/sbin:/sbin")
    (tmp / "sshd_config").write_text(
        textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
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
    # with the namespace), /tmp/ray becomes the test's own directory, then sshd
    # becomes PID 1: when it dies, the kernel kills everything the test started in there.
    (tmp / "init.sh").write_text(
        textwrap.dedent(f"""\
        set -eu
        mkdir -p {tmp}/overlay {tmp}/ray-tmp /tmp/ray /run/sshd
        mount -t tmpfs -o size=4g raymq-test {tmp}/overlay
        mkdir {tmp}/overlay/upper {tmp}/overlay/work
        mount -t overlay raymq-test \\
            -o lowerdir={home},upperdir={tmp}/overlay/upper,workdir={tmp}/overlay/work {home}
        mount --bind {tmp}/ray-tmp /tmp/ray
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


def _wait_for_ssh(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd namespace exited {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"sshd did not answer on port {port}:\n{log.read_text()}")


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


@pytest.fixture
def loopback_node(tmp_path: Path) -> Iterator[LoopbackNode]:
    if os.geteuid() != 0:
        pytest.skip("needs root: PID and mount namespaces, and root login over SSH")
    _ensure_tools()
    tmp = tmp_path / "node"
    tmp.mkdir()
    for name in ("client_key", "host_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True
        )
    shutil.copy(tmp / "client_key.pub", tmp / "authorized_keys")
    port = free_port()
    (tmp / "proxy.py").write_text(_PROXY)
    proxy = tmp / "proxy.sh"
    proxy.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp / 'proxy.py'} 127.0.0.1 {port}\n")
    proxy.chmod(0o755)

    proc, log = _start_namespace(tmp, port)
    node = None
    try:
        _wait_for_ssh(proc, port, log)
        [init] = _children(proc.pid)
        node = LoopbackNode(
            dir=tmp,
            port=port,
            ssh_user="root",
            ssh_private_key=tmp / "client_key",
            proxy_command=proxy,
            namespace=_pid_namespace(init),
            log=log,
        )
        assert node.namespace != _pid_namespace(os.getpid())
        yield node
    finally:
        _stop_namespace(proc, node)


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

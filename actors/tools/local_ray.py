"""The ``raymq`` command's Ray: connecting to it, and the local Ray that
``raymq up --local`` starts and ``raymq down`` stops.

``up --local`` runs ``ray start --head`` with the ``ray`` of the Python environment
the command runs in (next to ``sys.executable``), so it works whether or not the
environment is activated, and marks the head with the node resource
``raymq_up_local``. ``down`` stops a Ray so marked once no other namespace has
named actors in it, by ending that Ray's own processes only: ``ray stop`` would
end every Ray on the machine. Ray's own log lines (how it connects, that token
authentication is on) show only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ray

from actors.config.cluster import LOCAL_RAY_WORKER_NICENESS
from storage.errors import RayMQError

LOCAL_RAY_RESOURCE = "raymq_up_local"
"""The node resource marking a Ray head that ``raymq up --local`` started."""

STOP_GRACE_S = 10.0


def ensure_ray(args: argparse.Namespace, *, start_if_missing: bool = False) -> None:
    """Connect this process to the Ray of ``args`` (``--address``, ``RAY_ADDRESS``, the
    one running here, or with ``--local`` a new one)."""
    if ray.is_initialized():
        return
    # Ray's logger tells on every command how it connects and that token
    # authentication is on: only --verbose shows that (errors always show)
    level = logging.INFO if getattr(args, "verbose", False) else logging.ERROR
    logging.getLogger("ray").setLevel(level)
    common: dict[str, Any] = dict(logging_level=level, log_to_driver=False)
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:
        if _on_this_machine(address):
            _use_local_auth_token()
        ray.init(address=address, **common)
        return
    if not getattr(args, "local", False):
        try:
            ray.init(address="auto", **common)
            return
        except ConnectionError:
            if not start_if_missing:
                raise RayMQError(
                    "no Ray cluster is running here: start one with 'raymq up' "
                    "or 'ray start --head', or pass --address"
                ) from None
    _start_local_ray(args)
    _use_local_auth_token()
    ray.init(address=args.address, **common)


def _on_this_machine(address: str) -> bool:
    """Whether a Ray address (``host:port``, maybe ``ray://``) is on this machine."""
    import psutil  # Ray depends on it

    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        return False
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return ip in mine or ip.startswith("127.")


def _use_local_auth_token() -> None:
    """``ray start`` turns token authentication on when this machine has a token; a
    client given the address of a Ray on this machine must then turn it on too (Ray
    does that only for ``address="auto"``)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def ray_command() -> list[str]:
    """The ``ray`` command of the environment this Python runs in, whether or not the
    environment is activated (on ``PATH``)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [
        sys.executable,
        "-c",
        "import sys; from ray.scripts.scripts import main; sys.exit(main())",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_local_ray(args: argparse.Namespace) -> None:
    """``ray start --head`` on a free port; the head outlives this command, so the
    cluster's detached actors do too. Its output shows when it fails (or with
    ``--verbose``)."""
    port = _free_port()
    cmd = [
        *ray_command(),
        "start",
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--resources={json.dumps({LOCAL_RAY_RESOURCE: 1})}",
    ]
    if args.num_cpus:
        cmd.append(f"--num-cpus={args.num_cpus}")
    if args.ray_temp_dir:
        cmd.append(f"--temp-dir={args.ray_temp_dir}")
    print(f"starting a local Ray: {shlex.join(cmd)}", file=sys.stderr)
    quiet = not getattr(args, "verbose", False)
    done = subprocess.run(
        cmd,
        env={**os.environ, "RAY_worker_niceness": str(LOCAL_RAY_WORKER_NICENESS)},
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RayMQError(f"'ray start' failed with exit code {done.returncode}:\n{done.stdout}")
    args.address = f"{ray.util.get_node_ip_address()}:{port}"


def stop_local_ray(namespace: str) -> str:
    """Stop the Ray this process is connected to if ``raymq up --local`` started it and no
    namespace but ``namespace`` has named actors in it; what was done, in a sentence."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if not any(LOCAL_RAY_RESOURCE in n.get("Resources", {}) for n in nodes):
        return "Ray keeps running (raymq up --local did not start it)"
    others = sorted(
        {
            a["namespace"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] != namespace and not a["name"].startswith("_")
        }
    )
    if others:
        return (
            f"Ray keeps running: namespace(s) {', '.join(others)} have actors in it "
            "(raymq down --namespace NS for each, then raymq down stops it)"
        )
    address = ray.get_runtime_context().gcs_address
    ray.shutdown()
    stopped = stop_ray_processes(address)
    if not stopped:
        return f"the Ray at {address} runs on another machine: stop it there with 'ray stop'"
    return f"stopped the local Ray at {address} that raymq up --local started"


def stop_ray_processes(gcs_address: str) -> int:
    """End the processes of this machine that belong to the Ray cluster at
    ``gcs_address`` (GCS server, raylet, monitors, agents and workers), and only those;
    how many there were."""
    import psutil  # Ray depends on it

    def cmdline(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return ""

    procs = list(psutil.process_iter())
    sessions = set()  # a node's processes name the GCS or their session directory
    for p in procs:
        line = cmdline(p)
        if f"--gcs-address={gcs_address}" in line:
            for flag in ("--session-dir=", "--session_dir="):
                if flag in line:
                    sessions.add(line.split(flag, 1)[1].split()[0])
    family: dict[int, psutil.Process] = {}
    for p in procs:
        if sessions and any(session in cmdline(p) for session in sessions):
            family[p.pid] = p
            with contextlib.suppress(psutil.NoSuchProcess):
                family.update((c.pid, c) for c in p.children(recursive=True))
    family.pop(os.getpid(), None)

    # Stopped in stages, each told only once the one before has gone: the raylets (a
    # raylet takes its workers and agents along), then the others but the GCS, then
    # the GCS. Told all at once, the GCS and a raylet each waited for the other, and
    # the autoscaler's monitor, its GCS gone, for its own reports: 10 s (the whole
    # grace) every time, where staged they stop in about 2 s.
    def stage_of(p: psutil.Process) -> int:
        line = cmdline(p)
        return 0 if "raylet/raylet" in line else 2 if "gcs/gcs_server" in line else 1

    deadline = time.monotonic() + STOP_GRACE_S
    alive: list[psutil.Process] = []
    for stage in range(3):
        these = [p for p in family.values() if stage_of(p) == stage]
        for p in these:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _, left = psutil.wait_procs(these, timeout=max(0.0, deadline - time.monotonic()))
        alive += left
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    return len(family)

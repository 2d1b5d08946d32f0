"""`ray up` / `ray exec` / `ray down` with the real cluster.yaml, over SSH to this machine.

The cluster is a head and one worker, each a sandboxed node (see conftest.py) with its
own SSH daemon, loopback address (127.0.0.1, 127.0.0.2), processes, home and
``/data/raymq`` disk. Two SSH targets behind the launcher's one ``auth`` section: the
launcher's ``ProxyCommand`` picks the node's sshd from the address ssh was given, and
the head (to which Ray gives no proxy) finds the worker's port in its sandboxed
``~/.ssh/config``. Two sshds on port 22 of 127.0.0.1 and 127.0.0.2 would need a port
this machine's own sshd may hold; network namespaces with veth pairs would need routing
between them for Ray's many ports and the launcher's connections. Sharing the machine's
network costs only that every Ray port is a free one.

The test's copy of cluster.yaml changes only what a second cluster on the same machine
must change: the addresses, the SSH key and proxy, Ray's ports (plus no dashboard), and
the worker's node IP: Ray takes a node's IP from its route to the head, which on one
machine is the head's own, and the head's autoscaler, which keys heartbeats by the
address in ``worker_ips``, would keep restarting Ray on a worker it never hears from. Setup commands, file mounts, the store disk
at /data/raymq and the broker resources are the file's own. As docs/cluster.md tells a
user, the worker's ``node-resources.json`` is written once by hand: ``raymq-broker-b``.

`ray up` starts the head; the head's autoscaler starts the worker over SSH. The
quickstart's traffic then runs through broker-a on the head and broker-b on the worker
(tests/cluster/quickstart_on_two_nodes.py), broker-b is SIGKILLed and must come back
on the worker with its store, and everything sent must still be there. `ray down` stops
the head; the worker's Ray exits once it loses the head, and another Ray on this machine
never notices.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

MESSAGES = 20_000
# What runs on the head once the worker is up.
EXEC_COMMAND = (
    f"cd ~/raymq && python tests/cluster/quickstart_on_two_nodes.py --messages {MESSAGES}"
)

REPO = Path(__file__).resolve().parents[2]
LAUNCHER_TIMEOUT_S = 300
WORKER_UP_TIMEOUT_S = 300  # the head's autoscaler: rsync, setup commands, ray start
WORKER_GCS_WAIT_S = 10
WORKER_DOWN_TIMEOUT_S = 120  # seen: ~10 s (WORKER_GCS_WAIT_S), then the raylet's exit
# Ray's agents on a node whose raylet is gone: they exit a minute later (see below)
RAY_NODE_AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}


def sandboxed_config(cluster) -> Path:
    """cluster.yaml for the sandboxed nodes; fails if the file no longer has what it rewrites."""
    text = (REPO / "cluster.yaml").read_text()
    gcs = cluster.free_port()
    common = "--include-dashboard=false --disable-usage-stats"
    head_ports = (
        f"--port={gcs} --ray-client-server-port={cluster.free_port()} "
        f"--dashboard-agent-listen-port={cluster.free_port()} {common}"
    )
    worker_ports = (
        f"$RAY_HEAD_IP:{gcs} --node-ip-address={cluster.worker.ip} "
        f"--dashboard-agent-listen-port={cluster.free_port()} --disable-usage-stats"
    )
    for old, new in (("--port=6379", head_ports), ("$RAY_HEAD_IP:6379", worker_ports)):
        assert text.count(old) == 1, f"cluster.yaml should contain {old!r} once"
        text = text.replace(old, new)
    config = yaml.safe_load(text)
    config["cluster_name"] = f"raymq-test-{uuid.uuid4().hex[:8]}"
    config["provider"].update(head_ip=cluster.head.ip, worker_ips=[cluster.worker.ip])
    config["auth"] = {
        "ssh_user": cluster.ssh_user,
        "ssh_private_key": str(cluster.ssh_private_key),
        "ssh_proxy_command": str(cluster.proxy_command),
    }
    # The worker's raylet waits this long for a GCS that is gone before it exits (Ray's
    # default 60 s): `ray down` stops only the head, so the test waits that out.
    [start] = [c for c in config["worker_start_ray_commands"] if "ray start" in c]
    config["worker_start_ray_commands"] = [
        f"RAY_gcs_rpc_server_reconnect_timeout_s={WORKER_GCS_WAIT_S} {c}" if c == start else c
        for c in config["worker_start_ray_commands"]
    ]
    assert config["file_mounts"]["~/raymq"] == "."
    config["file_mounts"]["~/raymq"] = str(REPO)
    path = cluster.dir / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launcher_env(cluster) -> dict[str, str]:
    """The launcher keeps its state, its config cache and the token under the test's dir."""
    home, state = cluster.dir / "launcher-home", cluster.dir / "launcher-tmp"
    (home / ".ray").mkdir(parents=True)
    state.mkdir()
    (home / ".ray" / "auth_token").write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(HOME=str(home), RAY_TMPDIR=str(state), TMPDIR=str(state))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def ray_cli(env: dict[str, str], log: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ray.scripts.scripts", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LAUNCHER_TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    with log.open("a") as f:
        f.write(f"$ ray {' '.join(args)}\n{output}\n")
    assert done.returncode == 0, f"`ray {args[0]}` exited {done.returncode}:\n{output[-4000:]}"
    return output


def ssh_control_dir(cluster_name: str) -> Path:
    """Where Ray's launcher keeps this cluster's SSH control sockets (command_runner.py)."""
    user = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
    return Path(f"/tmp/ray_ssh_{user}") / hashlib.sha256(cluster_name.encode()).hexdigest()[:10]


def monitor_log(node, lines: int = 40) -> str:
    """The autoscaler's log on a node (it starts the workers): its last lines, each
    message once (it repeats itself every few seconds)."""
    if node.ray_logs is None:
        return "(no Ray session on the node)"
    out = []
    for path in sorted(node.ray_logs.glob("monitor*")):
        seen, kept = set(), []
        for line in path.read_text(errors="replace").splitlines():
            message = line.split(" -- ", 1)[-1]
            if message not in seen:
                seen.add(message)
                kept.append(line)
        out.append(f"--- {path.name}\n" + "\n".join(kept[-lines:]))
    return "\n".join(out)


def ray_left(node) -> list[str]:
    """What still runs on a node but its sshd and Ray's log monitor: the one Ray
    process that outlives its raylet (it only tails log files; the next `ray stop`,
    e.g. in the next `ray up`, ends it)."""
    return [
        f"{pid} {cmd}"
        for pid, cmd in node.command_lines().items()
        if not cmd.startswith("sshd") and "ray/_private/log_monitor.py" not in cmd
    ]


def wait_until(condition, timeout_s: float, what: str, detail=lambda: "") -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what} in {timeout_s}s\n{detail()}"
        time.sleep(1)
    return time.monotonic() - started


def test_ray_up_head_and_worker_exec_down(sentinel_ray, loopback_cluster):
    cluster = loopback_cluster
    config_path = sandboxed_config(cluster)
    cluster_name = yaml.safe_load(config_path.read_text())["cluster_name"]
    try:
        _up_exec_down(cluster, str(config_path), launcher_env(cluster), sentinel_ray)
    finally:
        shutil.rmtree(ssh_control_dir(cluster_name), ignore_errors=True)


def _store_files(node, broker: str) -> list[str]:
    return sorted(p.name for p in (node.data / broker / "commitlog").glob("*"))


def _up_exec_down(cluster, config, env, sentinel_ray):
    head, worker = cluster.head, cluster.worker
    log = cluster.dir / "launcher.log"
    sentinel_ray.wait_ready()
    assert sentinel_ray.answers(1)
    # written once by hand on the worker's disk, as docs/cluster.md says
    (worker.data / "node-resources.json").write_text('{"raymq-broker-b": 1}')
    took, started = {}, time.monotonic()

    ray_cli(env, log, "up", "-y", "--no-config-cache", config)
    took["up"] = time.monotonic() - started
    assert {"raylet", "gcs_server"} <= set(head.processes().values())
    assert (head.data / "node-resources.json").read_text().strip() == '{"raymq-broker-a": 1}'
    took["worker up"] = wait_until(
        lambda: "raylet" in worker.processes().values(),
        WORKER_UP_TIMEOUT_S,
        "the head's autoscaler did not start Ray on the worker",
        lambda: monitor_log(head),
    )
    assert "gcs_server" not in worker.processes().values()

    started = time.monotonic()
    output = ray_cli(env, log, "exec", config, EXEC_COMMAND)
    took["exec"] = time.monotonic() - started
    [line] = [x for x in output.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["problems"] == [], result
    before, after = result["before"], result["after"]
    a, b = before["broker-a"], before["broker-b"]
    # broker-b on the worker (its own node, its own address), broker-a on the head
    assert b["node_ip"] == worker.ip and a["node_ip"] != worker.ip, result
    assert a["node_id"] != b["node_id"], result
    assert result["per_broker"]["broker-b"] > 0 and result["per_broker"]["broker-a"] > 0
    assert sum(result["per_broker"].values()) == MESSAGES
    # ... each store on its own node's disk, and only there
    assert b["store_dir"] == "/data/raymq/broker-b" and a["store_dir"] == "/data/raymq/broker-a"
    assert _store_files(worker, "broker-b") and _store_files(head, "broker-a")
    assert not (head.data / "broker-b").exists() and not (worker.data / "broker-a").exists()
    # SIGKILLed, broker-b came back in another process on the same worker and store,
    # knowing it crashed, with every message (checked by the script: result["problems"])
    assert after["node_id"] == b["node_id"] and after["node_ip"] == worker.ip, result
    assert after["store_dir"] == b["store_dir"] and after["pid"] != b["pid"], result
    assert after["abnormal_start"] and not b["abnormal_start"], result
    assert result["consumed_after"] == MESSAGES

    started = time.monotonic()
    ray_cli(env, log, "down", "-y", config)
    took["down"] = time.monotonic() - started
    left = set(head.processes().values())
    assert not left & {"raylet", "gcs_server"}, left
    assert not ray_left(head), ray_left(head)

    # The local provider's `ray down` runs `ray stop` on the head only. The worker's
    # raylet gives up on the head's GCS after WORKER_GCS_WAIT_S; it, broker-b's process
    # and every other worker process are gone soon after that. Ray's two node agents
    # outlive it by a minute: each reports the raylet's death to the GCS that is gone,
    # with a 60 s timeout Ray hard-codes (ray._private.utils.publish_error_to_driver),
    # then exits. The test does not wait that minute out: they hold no store and no
    # port of ours, and the sandbox's teardown ends them.
    def left_but_agents() -> list[str]:
        return [p for p in ray_left(worker) if p.split(" ", 1)[1] not in RAY_NODE_AGENTS]

    took["worker left"] = wait_until(
        lambda: "raylet" not in worker.processes().values() and not left_but_agents(),
        WORKER_DOWN_TIMEOUT_S,
        "the worker's raylet, brokers or workers still run after `ray down`",
        lambda: "\n".join(ray_left(worker)),
    )
    print("ray up test, seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in took.items()))

    # `ray stop` ran on the nodes (in up and in down): the other Ray never noticed.
    assert sentinel_ray.answers(41)

"""`ray up` / `ray exec` / `ray down` with the real cluster.yaml, over SSH to this machine.

The head is a sandboxed node (see conftest.py) reached at 127.0.0.1. The test's copy of
cluster.yaml changes only what a second cluster on the same machine must change: the
address, the SSH key and port, the store root, and Ray's ports (plus no dashboard).
Setup commands, file mounts and the broker resource are the file's own.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

# What runs on the head once it is up: the quickstart, joining the cluster `ray up` started.
EXEC_COMMAND = "cd ~/raymq && python examples/quickstart.py --address auto --messages 20000"
EXPECTED_IN_OUTPUT = "every message arrived exactly once"

REPO = Path(__file__).resolve().parents[2]
LAUNCHER_TIMEOUT_S = 300


def sandboxed_config(node) -> Path:
    """cluster.yaml for the sandboxed node; fails if the file no longer has what it rewrites."""
    text = (REPO / "cluster.yaml").read_text()
    gcs = node.free_port()
    ports = (
        f"--port={gcs} --ray-client-server-port={node.free_port()} "
        f"--dashboard-agent-listen-port={node.free_port()} --include-dashboard=false "
        "--disable-usage-stats"
    )
    for old, new in (
        ("/data/raymq", str(node.dir / "data")),
        ("--port=6379", ports),
        ("$RAY_HEAD_IP:6379", f"$RAY_HEAD_IP:{gcs}"),
    ):
        assert old in text, f"cluster.yaml no longer contains {old!r}"
        text = text.replace(old, new)
    config = yaml.safe_load(text)
    config["cluster_name"] = f"raymq-test-{uuid.uuid4().hex[:8]}"
    config["provider"].update(head_ip="127.0.0.1", worker_ips=[])
    config["auth"] = {
        "ssh_user": node.ssh_user,
        "ssh_private_key": str(node.ssh_private_key),
        "ssh_proxy_command": str(node.proxy_command),
    }
    assert config["file_mounts"]["~/raymq"] == "."
    config["file_mounts"]["~/raymq"] = str(REPO)
    path = node.dir / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launcher_env(node) -> dict[str, str]:
    """The launcher keeps its state, its config cache and the token under the test's dir."""
    home, state = node.dir / "launcher-home", node.dir / "launcher-tmp"
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


def test_ray_up_exec_down(sentinel_ray, loopback_node):
    node = loopback_node
    config_path = sandboxed_config(node)
    config = str(config_path)
    env = launcher_env(node)
    log = node.dir / "launcher.log"
    cluster_name = yaml.safe_load(config_path.read_text())["cluster_name"]
    try:
        _up_exec_down(node, config, env, log, sentinel_ray)
    finally:
        shutil.rmtree(ssh_control_dir(cluster_name), ignore_errors=True)


def _up_exec_down(node, config, env, log, sentinel_ray):
    sentinel_ray.wait_ready()
    assert sentinel_ray.answers(1)

    ray_cli(env, log, "up", "-y", "--no-config-cache", config)
    running = set(node.processes().values())
    assert {"raylet", "gcs_server"} <= running, running

    output = ray_cli(env, log, "exec", config, EXEC_COMMAND)
    assert EXPECTED_IN_OUTPUT in output, output[-4000:]

    ray_cli(env, log, "down", "-y", config)
    left = set(node.processes().values())
    assert not left & {"raylet", "gcs_server"}, left

    # `ray stop` ran on the node (in up and in down): the other Ray never noticed.
    assert sentinel_ray.answers(41)

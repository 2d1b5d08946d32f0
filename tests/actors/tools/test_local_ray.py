"""``raymq up --local`` and ``raymq down`` as a user runs them, in fresh processes: a
local Ray started without the environment on ``PATH``, no Ray log lines unless
``--verbose``, and ``down`` stopping that Ray (and only it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
from raymq_testkit import SMALL_STORE, unique_namespace

from actors.tools.local_ray import stop_ray_processes

RAY_LOG_LINE = re.compile(r"\t(DEBUG|INFO|WARNING) \S+\.py:\d+ -- ")  # Ray's log format


def raymq(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.tools.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def ray_processes(gcs_address: str) -> list[psutil.Process]:
    """This machine's processes started for the Ray at ``gcs_address``."""
    found = []
    for p in psutil.process_iter():
        try:
            if f"--gcs-address={gcs_address}" in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def quiet(done: subprocess.CompletedProcess[str]) -> bool:
    """No line of Ray's own logging on stderr (token authentication, connecting ...)."""
    return "Token authentication" not in done.stderr and not RAY_LOG_LINE.search(done.stderr)


def test_up_local_runs_without_the_environment_on_path_and_down_stops_its_ray(
    tmp_path: Path,
) -> None:
    ns = unique_namespace("local")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # as in a shell
    env["PATH"] = "/usr/bin:/bin"  # the environment is not activated: no `ray` on PATH
    assert shutil.which("ray", path=env["PATH"]) is None
    config = tmp_path / "cluster.yaml"
    store = ", ".join(f"{k}: {v}" for k, v in SMALL_STORE.items())
    config.write_text(
        f"namespace: {ns}\nnameservers: 1\nbrokers: [broker-a]\n"
        f"store_root: {tmp_path / 'stores'}\n"
        f"broker: {{auto_create_topic_enable: true, store: {{{store}}}}}\n"
    )
    up = raymq("up", "--local", "--num-cpus", "2", "--config", str(config), "--json", env=env)
    assert up.returncode == 0, up.stderr
    address = json.loads(up.stdout)["ray_address"]
    try:
        assert ray_processes(address), "a Ray of its own"
        # its workers (the NameServer's too) at nice 0, not Ray's 15
        workers = [p for p in ray_processes(address) if "default_worker" in " ".join(p.cmdline())]
        assert workers and {p.nice() for p in workers} == {0}
        assert quiet(up), up.stderr
        for where in (["--address", address], []):  # given, and found as the latest here
            status = raymq("status", *where, "--namespace", ns, "--json", env=env)
            assert status.returncode == 0, status.stderr
            assert json.loads(status.stdout)["brokers"][0]["role"] == "MASTER"
            assert quiet(status), status.stderr
        verbose = raymq("status", "--address", address, "--namespace", ns, "--verbose", env=env)
        assert verbose.returncode == 0 and not quiet(verbose), "--verbose shows Ray's lines"

        down = raymq("down", "--address", address, "--namespace", ns, "--json", env=env)
        assert down.returncode == 0, down.stderr
        assert quiet(down), down.stderr
        result = json.loads(down.stdout)
    finally:  # never leave a Ray behind, and never stop any other
        stop_ray_processes(address)
    assert result["stopped"] == ["broker-a-0", "nameserver-0"]  # no keeper: nothing to move
    assert result["ray"].startswith(f"stopped the local Ray at {address}")
    assert not ray_processes(address)

"""The official RocketMQ 5 Node.js client (``tests/actors/grpc/node/rmq.js``, from npm), run
once per call by the gRPC door's tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

NODE_DIR = Path(__file__).parent / "node"


def node_client(args: dict[str, Any]) -> dict[str, Any]:
    """Run tests/actors/grpc/node/rmq.js (the official Node.js client, from npm) once."""
    if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=NODE_DIR,
            check=True,
            timeout=600,
        )
    done = subprocess.run(
        ["node", "rmq.js", json.dumps(args)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, (
        f"node exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    )
    out: dict[str, Any] = json.loads(lines[-1])
    return out


class NodeClient:
    """rmq.js started in the background: its lines read as they come (a mode that says
    when it is ready before it goes on), its last line the result."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            ["node", "rmq.js", json.dumps(args)],
            cwd=NODE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def line(self) -> dict[str, Any]:
        """The next line it writes (a JSON object)."""
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        assert text, f"node exited {self.proc.wait()}: {self.proc.stderr.read()[-4000:]}"  # type: ignore[union-attr]
        out: dict[str, Any] = json.loads(text)
        return out

    def result(self, timeout_s: float = 180) -> dict[str, Any]:
        """Its last line, once it exited 0."""
        out, err = self.proc.communicate(timeout=timeout_s)
        lines = out.strip().splitlines()
        assert self.proc.returncode == 0 and lines, (
            f"node exited {self.proc.returncode}:\n{out}\n{err[-4000:]}"
        )
        last: dict[str, Any] = json.loads(lines[-1])
        return last

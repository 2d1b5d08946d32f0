"""cluster.yaml (and the AWS variant in docs/cluster.md) is a valid Ray cluster config."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _cluster_yaml() -> dict[str, Any]:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def _aws_yaml() -> dict[str, Any]:
    docs = (REPO / "docs" / "cluster.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "type: aws" in b]
    assert len(blocks) == 1, "docs/cluster.md should hold exactly one AWS cluster YAML"
    return yaml.safe_load(blocks[0])


CONFIGS = {"cluster.yaml": _cluster_yaml, "docs/cluster.md (AWS)": _aws_yaml}


@pytest.mark.parametrize("name", CONFIGS)
def test_validates_against_rays_schema_as_written(name):
    jsonschema.validate(CONFIGS[name](), SCHEMA)


@pytest.mark.parametrize("name", CONFIGS)
def test_validates_after_ray_up_fills_in_its_defaults(name):
    # The path `ray up` takes before it contacts any node (commands._bootstrap_config).
    config = prepare_config(copy.deepcopy(CONFIGS[name]()))
    validate_config(config)


def test_on_premise_provider_with_placeholders_to_fill():
    config = _cluster_yaml()

    assert config["provider"]["type"] == "local"
    assert config["provider"]["head_ip"] == "HEAD_IP"
    assert all(ip.startswith("WORKER_IP") for ip in config["provider"]["worker_ips"])
    assert set(config["auth"]) == {"ssh_user", "ssh_private_key"}


def test_every_node_gets_raymq_and_java():
    config = _cluster_yaml()
    setup = "\n".join(config["setup_commands"])

    assert config["file_mounts"]["~/raymq"] == "."
    assert "~/.ray/auth_token" in config["file_mounts"]
    assert "pip install -q -e ~/raymq" in setup
    # and its bytecode, which an environment with PYTHONDONTWRITEBYTECODE never writes
    assert "compileall -q ~/raymq/actors ~/raymq/storage" in setup
    assert "openjdk-17-jre-headless" in setup and "command -v java" in setup


def test_nodes_declare_broker_resources_from_their_store_disk():
    config = _cluster_yaml()
    resources = '--resources="$(cat /data/raymq/node-resources.json)"'

    assert "ray start --head --port=6379" in config["head_start_ray_commands"][-1]
    assert resources in config["head_start_ray_commands"][-1]
    assert resources in config["worker_start_ray_commands"][-1]
    assert '{"raymq-broker-a": 1}' in config["head_setup_commands"][0]
    assert "'{}'" in config["worker_setup_commands"][0]


def test_workers_are_started_and_may_join():
    # test_ray_up.py shows why, in minutes; this says it at once if one goes missing:
    # Ray's v2 autoscaler never starts a local provider's workers, and `ray start
    # --address` does not turn token authentication on by itself.
    config = _cluster_yaml()
    head, worker = config["head_start_ray_commands"][-1], config["worker_start_ray_commands"][-1]

    assert "RAY_enable_autoscaler_v2=0 ray start --head" in head
    assert "RAY_AUTH_MODE=token" in head and "RAY_AUTH_MODE=token" in worker
    # workers at a server's priority, not Ray's nice 15 (docs/latency.md)
    assert "RAY_worker_niceness=0" in head and "RAY_worker_niceness=0" in worker


def test_aws_variant_pins_each_broker_to_one_nvme_instance():
    node_types = _aws_yaml()["available_node_types"]
    brokers = {k: v for k, v in node_types.items() if k.startswith("broker-")}

    assert brokers
    for name, node_type in brokers.items():
        assert node_type["resources"] == {f"raymq-{name}": 1}
        assert node_type["min_workers"] == node_type["max_workers"] == 1
        assert node_type["node_config"]["InstanceType"].startswith(("i4i.", "i3en."))
        assert "/data/raymq" in node_type["initialization_commands"][0]

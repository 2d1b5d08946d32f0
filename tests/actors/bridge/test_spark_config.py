"""init_spark's configuration: Java 17 flags everywhere a JVM starts, small defaults, caller wins."""

from __future__ import annotations

import sys
from pathlib import Path

import ray

from actors.bridge.spark import _JAVA_OPTION_KEYS, JAVA17_OPTIONS, _merge_configs


def test_java17_flags_reach_driver_executors_and_app_master():
    configs = _merge_configs(1, 1, None)

    for key in (
        "spark.driver.extraJavaOptions",
        "spark.executor.extraJavaOptions",
        "spark.ray.raydp_app_master.extraJavaOptions",
    ):
        assert configs[key].split() == list(JAVA17_OPTIONS)
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in JAVA17_OPTIONS
    assert len(_JAVA_OPTION_KEYS) == 3


def test_defaults_fit_a_small_machine_and_use_this_python():
    configs = _merge_configs(2, 1, None)

    assert configs["spark.sql.shuffle.partitions"] == "4"
    assert configs["spark.pyspark.python"] == sys.executable
    assert configs["spark.pyspark.driver.python"] == sys.executable
    assert configs["spark.ray.raydp_spark_master.actor.resource.CPU"] == "0"


def test_caller_configs_override_and_java_options_append():
    configs = _merge_configs(
        1,
        1,
        {"spark.sql.shuffle.partitions": "64", "spark.executor.extraJavaOptions": "-Xss4m"},
    )

    assert configs["spark.sql.shuffle.partitions"] == "64"
    assert configs["spark.executor.extraJavaOptions"].split() == [*JAVA17_OPTIONS, "-Xss4m"]
    assert configs["spark.driver.extraJavaOptions"].split() == list(JAVA17_OPTIONS)


def test_the_driver_logs_into_the_connected_session_not_the_newest_one_on_the_machine(spark):
    """RayDP's agent falls back to /tmp/ray/session_latest/logs, which another Ray started
    on the machine moves, and which dangles once that session is removed."""
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions").split()

    assert f"-Dray.logging.dir={logs}" in options
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    assert (logs / f"slf4j-{pid}.log").is_file()

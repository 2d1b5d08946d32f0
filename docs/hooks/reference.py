"""mkdocs hook: the reference pages' tables, generated from the code at build time.

A page holds a marker line ``<!-- reference: KIND -->`` (settings of one config class,
the CLI's help, the wire protocol's requests) and the hook puts the generated Markdown
in its place, so a setting, a command or a request added to the code shows in the docs
at the next build and a renamed one cannot linger. It also shows the API pages'
Sphinx roles as plain code (``on_page_content``).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import os
import re
import textwrap
from typing import Any

_MARKER = re.compile(r"^<!-- reference: (?P<kind>[a-z-]+)(?: (?P<arg>\S+))? -->$", re.M)

# RocketMQ's names for client settings (the broker's and the store's come from the
# broker.conf readers in the code: actors.config.broker and storage.config).
_CLIENT_ROCKETMQ = {
    "send_timeout_s": "sendMsgTimeout (ms)",
    "retry_times_when_send_failed": "retryTimesWhenSendFailed",
    "retry_times_when_send_async_failed": "retryTimesWhenSendAsyncFailed",
    "max_message_size": "maxMessageSize",
    "default_topic_queue_nums": "defaultTopicQueueNums",
    "route_refresh_s": "pollNameServerInterval (ms)",
    "send_latency_fault_enable": "sendLatencyFaultEnable",
    "async_send_max_messages": "backPressureForAsyncSendNum",
    "async_send_max_bytes": "backPressureForAsyncSendSize",
    "pull_timeout_s": "consumerPullTimeoutMillis",
    "consume_thread_min": "consumeThreadMin",
    "consume_thread_max": "consumeThreadMax",
    "pull_batch_size": "pullBatchSize",
    "consume_batch_size": "consumeMessageBatchMaxSize",
    "max_reconsume_times": "maxReconsumeTimes",
    "consume_from": "consumeFromWhere",
    "consume_timestamp": "consumeTimestamp",
    "model": "messageModel",
    "suspend_current_queue_time_s": "suspendCurrentQueueTimeMillis",
    "pull_threshold_for_queue": "pullThresholdForQueue",
    "pull_threshold_size_for_queue": "pullThresholdSizeForQueue",
    "pull_interval_s": "pullInterval",
    "consume_timeout_s": "consumeTimeout (min)",
    "persist_offset_interval_s": "persistConsumerOffsetInterval",
    "heartbeat_interval_s": "heartbeatBrokerInterval",
    "orderly": "MessageListenerOrderly",
    "rebalance_strategy": "allocateMessageQueueStrategy",
    "machine_room": "clientIP's machine room (AllocateMachineRoomNearby)",
    "broker_expired_s": "BROKER_CHANNEL_EXPIRED_TIME",
    "scan_interval_s": "scanNotActiveBroker period",
}

_SETTINGS = {
    "broker": ("actors.config.broker", "BrokerConfig", "actors.config.broker", "_BROKER_CONF_KEYS"),
    "store": ("storage.config", "StoreConfig", "storage.config", "_CONF_KEYS"),
    "producer": ("actors.config.client", "ProducerConfig", None, None),
    "consumer": ("actors.config.client", "ConsumerConfig", None, None),
    "push-consumer": ("actors.client", "PushConsumerConfig", None, None),
    "cluster": ("actors.config.cluster", "ClusterConfig", None, None),
    "broker-spec": ("actors.config.cluster", "BrokerSpec", None, None),
    "nameserver": ("actors.config.namesrv", "NameServerConfig", None, None),
    "coordinator": ("actors.config.coordinator", "CoordinatorConfig", None, None),
    "console": ("actors.config.console", "ConsoleConfig", None, None),
    "fleet": ("actors.fleet", "FleetConfig", None, None),
}


def _rst_to_md(text: str) -> str:
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return " ".join(text.split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _attribute_docs(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """The docstring under each annotated attribute of a class body (PEP 257's
    attribute docstrings, as Sphinx and griffe read them), and the comment lines right
    above an attribute (a group's heading: "# expiry: CleanCommitLogService")."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs, headings = {}, {}
    for node, nxt in zip(body, [*body[1:], None]):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[name] = _rst_to_md(nxt.value.value)
        above = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        if above:
            headings[name] = _rst_to_md(" ".join(above).removeprefix("---").strip(" -"))
    return docs, headings


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if isinstance(value, enum.Enum):
        return f"`{value.name}`"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20:
        for shift, unit in ((30, "GiB"), (20, "MiB")):
            if value % (1 << shift) == 0:
                return f"`{value:_}` ({value >> shift} {unit})"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"`{value:_}`"
    if dataclasses.is_dataclass(value):
        return f"`{type(value).__name__}()`"
    if f.name.endswith("secret_key"):
        return '`""`'
    return f"`{value!r}`"


def _settings(kind: str) -> str:
    module, name, conf_module, conf_map = _SETTINGS[kind]
    cls = getattr(importlib.import_module(module), name)
    rocketmq = dict(_CLIENT_ROCKETMQ)
    if conf_map:
        keys = getattr(importlib.import_module(conf_module), conf_map)
        rocketmq = {field: key for key, (field, _convert) in keys.items()}
    docs, headings = _attribute_docs(cls)
    rows = ["| setting | default | RocketMQ | what |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or not f.init:
            continue
        if f.name in headings:
            rows.append(f"| | | | *{_cell(headings[f.name])}* |")
        rows.append(
            f"| `{f.name}` | {_cell(_default(f))} | {rocketmq.get(f.name, '')} "
            f"| {_cell(docs.get(f.name, ''))} |"
        )
    doc = _rst_to_md(inspect.getdoc(cls) or "")
    return f"`{module}.{name}`: {doc}\n\n" + "\n".join(rows)


def _arguments(name: str) -> str:
    """A public client's constructor arguments besides its config object's fields."""
    import actors

    cls = getattr(actors, name)
    rows = ["| argument | default |", "|---|---|"]
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        default = "required" if p.default is p.empty else f"`{p.default!r}`"
        rows.append(f"| `{p.name}` | {_cell(default)} |")
    return f"`actors.{name}(...)`\n\n" + "\n".join(rows)


def _cli() -> str:
    import argparse

    from actors.tools import cli

    os.environ["COLUMNS"] = "88"
    out: list[str] = []

    def walk(parser: argparse.ArgumentParser, depth: int) -> None:
        out.append(f"{'#' * min(depth, 4)} `{parser.prog}`\n")
        out.append("```text\n" + parser.format_help().rstrip() + "\n```\n")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub, depth + 1)

    walk(cli._parser(), 2)
    return "\n".join(out)


def _protocol(which: str) -> str:
    from actors.protocol import requests

    table = requests.BROKER if which == "broker" else requests.COORDINATOR
    rows = [
        "| request | code | Ray method | header fields (wire key) | errors | what |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(table, key=lambda r: r.code):
        fields = ", ".join(
            f"`{f.name}` ({'body' if f.key is None else '`' + f.key + '`'})" for f in r.fields
        )
        errors = ", ".join(f"`{e.__name__}`" for e in r.errors)
        rows.append(
            f"| `{r.name}` | {r.code} | `{r.method}` | {_cell(fields)} | {errors} "
            f"| {_cell(_rst_to_md(r.doc))} |"
        )
    return "\n".join(rows)


def _generate(kind: str, arg: str | None) -> str:
    if kind == "settings" and arg in _SETTINGS:
        return _settings(arg)
    if kind == "arguments" and arg:
        return _arguments(arg)
    if kind == "cli":
        return _cli()
    if kind == "protocol" and arg in ("broker", "coordinator"):
        return _protocol(arg)
    raise ValueError(f"unknown reference marker: {kind} {arg}")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return _MARKER.sub(lambda m: _generate(m["kind"], m["arg"]), markdown)


_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):(<code>)~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Docstrings name code with Sphinx roles (``:class:`Producer```), which Markdown
    renders as a role followed by code: the API pages show the code alone."""
    return _ROLE.sub(r"\1", html)

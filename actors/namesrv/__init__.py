"""The NameServer (RocketMQ's ``namesrv``): the actor, its route table, and the
clients' way of asking it (fail over between NameServers, cache routes)."""

from __future__ import annotations

from actors.namesrv.client import NameServerClient, discover_nameservers
from actors.namesrv.nameserver import NameServer
from actors.namesrv.route_info import RouteInfoManager

__all__ = ["NameServer", "NameServerClient", "RouteInfoManager", "discover_nameservers"]

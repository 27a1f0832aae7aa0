"""Which host of the logs each scraped instance is.

Prometheus names a target by its address (``instance``: ``10.3.0.17:9100`` under
Kubernetes, ``dgx001:9100`` with static targets); NCCL prints the node's host name cut at
its first dot.  The exporters say their node's name in their own labels, which are
preferred to the address, in this order (:data:`IDENTITY`):

- node_exporter's ``node_uname_info{nodename}`` (``how``: ``uname``);
- dcgm-exporter's ``Hostname`` label, on every field it exports (``hostname`` since
  its May 2026 rename, NVIDIA/dcgm-exporter#655; its ``NODE_NAME`` where set, as its
  Helm chart sets it, else its container's host name) (``dcgm``);
- the agent's ``ncclscope_node_info{hostname}`` (``agent``);
- else the instance's own host part (``dgx001:9100`` -> ``dgx001``: ``instance``).

A name matches a log host by its short form (cut at the first dot, as NCCL cuts it),
case-insensitively.  An IP address is never matched (NCCL prints names; a guess from an
address would pin another node's counters on a rank).  What matches no log host is kept
with a null ``host`` and listed, never guessed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import polars as pl

from ncclscope.schema import CLUSTER_INSTANCES_SCHEMA

__all__ = [
    "DCGM_HOST_LABELS",
    "IDENTITY",
    "IDENTITY_MATCHES",
    "HostMatcher",
    "instance_host",
    "map_instances",
]


@dataclass(frozen=True)
class Identity:
    """A series that names its node: the labels that may hold the name (the first
    present), and ``how`` it is said."""

    labels: tuple[str, ...]
    how: str

    def name(self, labels: Mapping[str, str]) -> str | None:
        return next((labels[k] for k in self.labels if labels.get(k)), None)


#: dcgm-exporter's label naming its node, as it was spelt, then as it is.
DCGM_HOST_LABELS = ("Hostname", "hostname")
#: Series name -> the label naming the node (``DCGM_FI_`` series by prefix).
IDENTITY: dict[str, Identity] = {
    "node_uname_info": Identity(("nodename",), "uname"),
    "DCGM_FI_": Identity(DCGM_HOST_LABELS, "dcgm"),
    "ncclscope_node_info": Identity(("hostname",), "agent"),
}
#: Preference among the ways (lower first).
_RANK = {"uname": 0, "dcgm": 1, "agent": 2, "instance": 3}

#: The ``match[]`` selectors of the series request that finds every instance and what
#: names it: ``up`` (every target), and the identity series above.  dcgm-exporter puts
#: ``Hostname`` on every field; two fields of its default list are enough to see it.
IDENTITY_MATCHES = (
    "up",
    "node_uname_info",
    "ncclscope_node_info",
    '{__name__=~"DCGM_FI_DEV_(XID_ERRORS|GPU_TEMP)"}',
)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def instance_host(instance: str) -> str:
    """The host part of a target's address.

    >>> instance_host("dgx001:9100"), instance_host("[fe80::1]:9100"), instance_host("a.b")
    ('dgx001', 'fe80::1', 'a.b')
    """
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    if instance.count(":") == 1:
        return instance.split(":", 1)[0]
    return instance


class HostMatcher:
    """Names as exporters say them -> the logs' spelling (None: no log host, or an IP)."""

    def __init__(self, log_hosts: Iterable[str]) -> None:
        self.hosts: dict[str, str] = {}
        for h in log_hosts:
            if h and not _is_ip(h):
                self.hosts.setdefault(_key(h), h)

    def __call__(self, name: str | None) -> str | None:
        if not name or _is_ip(name.strip()):
            return None
        return self.hosts.get(_key(name))


def _key(name: str) -> str:
    return name.strip().split(".", 1)[0].lower()


def _identity(labels: Mapping[str, str]) -> Identity | None:
    name = labels.get("__name__", "")
    found = IDENTITY.get(name)
    if found is None:
        found = next(
            (v for k, v in IDENTITY.items() if k.endswith("_") and name.startswith(k)), None
        )
    return found


def map_instances(
    label_sets: Iterable[Mapping[str, str]], log_hosts: Iterable[str]
) -> pl.DataFrame:
    """One row per (instance, job): the log host it is (CLUSTER_INSTANCES_SCHEMA), by the
    most preferred way that names one; ``host`` null, ``how`` the best way tried, where
    none does.  ``label_sets``: the series of the identity request (:data:`IDENTITY_MATCHES`)
    and of any answer (their ``instance`` and ``job`` labels)."""
    match = HostMatcher(log_hosts)
    best: dict[tuple[str, str], tuple[int, str | None, str]] = {}
    for labels in label_sets:
        instance = labels.get("instance")
        if not instance:
            continue
        key = (instance, labels.get("job", ""))
        tries: list[tuple[str | None, str]] = [(match(instance_host(instance)), "instance")]
        ident = _identity(labels)
        if ident is not None:
            tries.insert(0, (match(ident.name(labels)), ident.how))
        for host, how in tries:
            rank = _RANK[how] + (0 if host is not None else 10)
            old = best.get(key)
            if old is None or rank < old[0]:
                best[key] = (rank, host, how)
    rows = [
        {"instance": i, "job": j, "host": host, "how": how}
        for (i, j), (_r, host, how) in sorted(best.items())
    ]
    return (
        pl.DataFrame(rows, schema=CLUSTER_INSTANCES_SCHEMA, orient="row")
        if rows
        else (pl.DataFrame(schema=CLUSTER_INSTANCES_SCHEMA))
    )

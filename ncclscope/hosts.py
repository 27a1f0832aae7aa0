"""Host identity: one spelling of a host's name for logs and telemetry.

NCCL prints ``gethostname()`` cut at the first dot (``getHostName(hostname, 1024, '.')``,
``src/misc/utils.cc``): a node whose name is ``node-7.cluster.internal`` logs as
``node-7``, while the agent beside it records ``socket.gethostname()`` whole.  Wherever a
telemetry host meets a log host they are compared under :func:`short_host`: the name cut
at its first dot, as NCCL cuts it, except an IP address, which stays whole (cutting
``10.0.0.1`` would make every host of a subnet ``10``).

>>> short_host("node-7.cluster.internal"), short_host("node-7"), short_host("10.0.0.1")
('node-7', 'node-7', '10.0.0.1')
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import polars as pl

__all__ = [
    "IPV4",
    "host_map",
    "short_host",
    "short_host_expr",
    "unmatched_hosts",
    "with_log_hosts",
]

#: A dotted IPv4 address (what some clusters set as the host name).
IPV4 = r"^\d{1,3}(\.\d{1,3}){3}$"


def short_host(name: str) -> str:
    """The host's name as NCCL prints it: cut at the first dot, an IP address whole.

    >>> short_host("gpu-a.b.c"), short_host("fe80::1"), short_host("")
    ('gpu-a', 'fe80::1', '')
    """
    name = name.strip()
    if ":" in name:  # IPv6 (has no dot to cut at anyway) or odd input: whole
        return name
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return name.split(".", 1)[0]
    return name


def short_host_expr(col: pl.Expr) -> pl.Expr:
    """:func:`short_host` over a string column (null stays null)."""
    text = col.str.strip_chars()
    return (
        pl.when(text.str.contains(IPV4) | text.str.contains(":"))
        .then(text)
        .otherwise(text.str.split(".").list.first())
    )


def _is_ipv4(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def host_map(telemetry_hosts: Iterable[str], log_hosts: Iterable[str]) -> dict[str, str]:
    """Each telemetry host's name in the logs: itself where the logs print it so, else
    :func:`short_host` of it.  An IP address whose first label alone is a log host (NCCL
    cuts every name at its first dot, ``10.0.0.1`` included) maps there when no other
    telemetry host shares that label; else it keeps its own name.  A host of neither
    kind keeps its short name (and matches no rank: :func:`unmatched_hosts`).

    >>> host_map(["node-7.cluster.internal", "10.0.0.1", "gpu"], ["node-7", "10", "gpu"])
    {'10.0.0.1': '10', 'gpu': 'gpu', 'node-7.cluster.internal': 'node-7'}
    >>> host_map(["10.0.0.1", "10.0.0.2"], ["10"])
    {'10.0.0.1': '10.0.0.1', '10.0.0.2': '10.0.0.2'}
    """
    logs = set(log_hosts)
    tel = sorted(set(telemetry_hosts))
    first = [t.split(".", 1)[0] for t in tel if _is_ipv4(t)]
    out: dict[str, str] = {}
    for t in tel:
        short = short_host(t)
        if t in logs or short in logs:
            out[t] = t if t in logs else short
            continue
        label = t.split(".", 1)[0]
        if _is_ipv4(t) and label in logs and first.count(label) == 1:
            out[t] = label
        else:
            out[t] = short
    return out


def unmatched_hosts(telemetry_hosts: Iterable[str], log_hosts: Iterable[str]) -> list[str]:
    """Telemetry hosts (as recorded) that name no host of the logs, even under
    :func:`host_map`; empty when the logs name no host at all.

    >>> unmatched_hosts(["node-7.a", "node-9.a"], ["node-7", "node-8"])
    ['node-9.a']
    """
    logs = set(log_hosts)
    if not logs:
        return []
    return sorted(t for t, h in host_map(telemetry_hosts, logs).items() if h not in logs)


def with_log_hosts(telemetry: pl.DataFrame, log_hosts: Iterable[str]) -> pl.DataFrame:
    """The telemetry with its ``host`` column spelled as the logs spell it (:func:`host_map`)."""
    if telemetry.is_empty() or "host" not in telemetry.columns:
        return telemetry
    names = telemetry["host"].drop_nulls().unique().to_list()
    mapping = host_map(names, log_hosts)
    if all(k == v for k, v in mapping.items()):
        return telemetry
    return telemetry.with_columns(
        pl.col("host").replace_strict(mapping, default=pl.col("host"), return_dtype=pl.String)
    )

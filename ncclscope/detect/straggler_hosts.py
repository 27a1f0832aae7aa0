"""Stragglers among hosts: a host against the other hosts, and whether its lateness is
a slow node or its clock.

Per instance every member logged, each host's median arrival against the median host's
(the other host's when there are two), so a node whose ranks are all late is named as a
node, and a host of one rank is a host like the others.  A host is a slow node only when
its ranks are late together (its first member too): one late rank of a small host is
that rank, not the node.  Hosts' clocks differ (NTP: milliseconds; a broken one:
seconds), so a constant shift is either a clock or a constant delay.  What does not read
the clocks decides: in a log merged as lines were written (one launcher reading every
worker's pipe) a late host's lines come *after* the others', a host whose clock is ahead
only prints later times on lines that sit among theirs (``order_after``); a lateness
that comes and goes, that grows with the compute before each collective, or that differs
between collective kinds or communicators (spanning the same hosts) is not a clock,
which shifts every stamp of the host alike (``_kind_spreads``).  Where nothing tells
(separate files, a shift the same at every kind) the finding says both and what to
check (``chronyc tracking``), as ``info`` within what NTP drifts.  Two hosts mirror
each other (one's spell is the other's rest of the run): the spell whose lateness
grows with the compute gap is the slow one; where none does, neither is blamed
(``cause`` ``slow_unattributed``, ``info``).

Part of the straggler detector's policy (``detect/straggler.py``): ``host_findings``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import polars as pl

from ncclscope.detect.base import (
    SEVERITIES,
    Finding,
    LineRef,
    Severity,
    duration_text,
    ranks_text,
)
from ncclscope.detect.context import Context
from ncclscope.detect.lateness import (
    CRITICAL_SLOWDOWN,
    MIN_EXCESS_S,
    MIN_INSTANCES,
    MIN_SLOWDOWN,
    MIN_WINDOW,
    MIN_Z,
    WHOLE_RUN,
    Window,
    find_window,
    iso,
    mad,
    sorted_median,
    window_evidence,
    with_lateness,
)

__all__ = ["host_findings"]

#: worker's pipe), a host that truly arrives after the others has its lines after theirs;
#: a host whose clock is ahead has later times on lines that still sit among theirs.
#: Simultaneous arrivals put a host after the reference in about half the instances, so
#: from this share on the host truly came after the others ...
_ORDER_SLOW = 0.9
#: ... and up to this share its timestamps' lateness is not in the order: its clock's.
_ORDER_CLOCK = 0.65
#: A constant shift this large (seconds) is beyond what synchronised clocks drift apart
#: (NTP keeps hosts within milliseconds, tens at worst): either the clock is not
#: synchronised or the node is that slow, and either needs a look.
_UNSYNCED_S = 0.1
#: A clock offset from which the clock is broken (chrony steps a clock that is off by
#: more than a second: it is not being disciplined at all).
_BROKEN_CLOCK_S = 1.0
#: Hosts up to which each is compared with the median of the others (exact, a join of
#: hosts x hosts per collective); beyond, with the median of all.
_LOO_HOSTS = 16
#: the fewest whose median survives two wild values and whose MAD says something.  One
#: long gap a step (the optimizer's) leaves few of them on a short or cut log; the
#: ``MIN_Z`` test on their median does the rest.
_MIN_GROUP = 5


def _host_instances(ctx: Context) -> pl.DataFrame:
    """Per (communicator spanning >= 2 hosts, sampled instance, host): the host's median
    arrival (``t_us``, its own clock), its members' median line (``pos``), the file its
    lines are in, and the instance's reference arrival (``ref_us``: the median of the
    other hosts' arrivals; of all hosts' from ``_LOO_HOSTS`` hosts on, where one host
    moves the median little) and ``delta_s`` = the host's arrival minus it.  ``merged``:
    all the instance's lines are in one file (a merged stream)."""
    rows = with_lateness(ctx)
    if rows.is_empty():
        return pl.DataFrame()
    rows = rows.filter(pl.col("host").n_unique().over("comm_key") >= 2)
    if rows.is_empty():
        return pl.DataFrame()
    per = rows.group_by("comm_key", "seq", "host").agg(
        pl.col("ts").dt.epoch("us").median().alias("t_us"),
        pl.col("ts").dt.epoch("us").min().alias("t_first_us"),
        pl.col("line_no").median().alias("pos"),
        pl.col("line_no").min().alias("pos_first"),
        pl.col("file_id").min().alias("f0"),
        pl.col("file_id").max().alias("f1"),
        pl.col("ts").min().alias("ts_first"),
        pl.col("op").first(),
        pl.len().alias("k"),
    )
    inst = ["comm_key", "seq"]
    hosts = pl.len().over(inst)
    # A host's own time from the previous collective to this one (its clock cancels);
    # only between consecutive ones (every collective sampled).
    step = pl.col("seq").diff().over("comm_key", "host")
    own_gap = (
        pl.when(step == 1)
        .then(pl.col("t_us").diff().over("comm_key", "host") / 1e6)
        .otherwise(None)
        .alias("own_gap_s")
    )
    per = per.with_columns(
        hosts.alias("hosts"),
        # How far the host's typical member came after its first (one clock): small
        # when its ranks arrive together, half a lone late rank's delay on a host of two.
        ((pl.col("t_us") - pl.col("t_first_us")) / 1e6).alias("inner_s"),
    ).drop("t_first_us")
    # Leave-one-out: a host is compared with the others only (with two hosts, each with
    # the other: a signed difference), so that it is never its own reference.
    few = (
        per.filter(pl.col("hosts") <= _LOO_HOSTS)
        .select(*inst, "host", "t_us", "pos", "hosts")
        .with_columns(
            pl.col("t_us").sort().implode().over(inst).alias("_ts"),
            pl.col("pos").sort().implode().over(inst).alias("_ps"),
        )
    )
    others = few.select(
        *inst,
        "host",
        _others_median("_ts", "t_us", inst).alias("loo_t"),
        _others_median("_ps", "pos", inst).alias("loo_pos"),
    )
    per = per.join(others, on=[*inst, "host"], how="left")
    return (
        per.with_columns(
            pl.coalesce("loo_t", pl.col("t_us").median().over(inst)).alias("ref_us"),
            pl.coalesce("loo_pos", pl.col("pos").median().over(inst)).alias("ref_pos"),
            (pl.col("f0").min().over(inst) == pl.col("f1").max().over(inst)).alias("merged"),
            pl.col("ts_first").min().over(inst).alias("at"),
        )
        .with_columns(((pl.col("t_us") - pl.col("ref_us")) / 1e6).alias("delta_s"))
        .sort("comm_key", "host", "seq")
        .with_columns(own_gap)
    )


def _others_median(sorted_col: str, value: str, inst: list[str]) -> pl.Expr:
    """The median of the instance's other hosts' ``value``: read off the instance's
    values in order (``sorted_col``) with the host's own place skipped.  The same numbers
    as a join of hosts x hosts and a median per host, without the rows of that join (the
    largest table of the detector on a big job); polars' median of an even count is
    ``a + (b - a) * 0.5``, computed the same way here.  None for a host alone at the
    instance."""
    others = pl.col("hosts").cast(pl.Int64) - 1
    own = pl.col(value).rank("ordinal").over(inst).cast(pl.Int64) - 1

    def nth(j: pl.Expr) -> pl.Expr:
        return pl.col(sorted_col).list.get(pl.when(j < own).then(j).otherwise(j + 1))

    a, b = nth((others - 1) // 2), nth(others // 2)
    return pl.when(others >= 1).then(a + (b - a) * 0.5)


def _cause(order_after: float | None, spell: bool, grows: bool, kinds: bool = False) -> str:
    """What a host's lateness is, from the signals that do not read its clock.

    ``order_after``: the share of instances whose lines (in a stream merged as they were
    written) show the host after the others.  A real delay puts its lines after the
    others'; a clock offset only changes the times printed on them.  ``spell``: the
    lateness held for part of the run; ``grows``: it is larger after a longer compute
    phase; ``kinds``: it differs between collective kinds or communicators.  A clock
    offset does none of these: it shifts every stamp of the host alike.

    >>> _cause(0.98, False, False), _cause(0.5, False, False), _cause(None, False, True)
    ('slow', 'clock', 'slow')
    >>> _cause(None, False, False), _cause(None, False, False, True)
    ('clock_or_constant_delay', 'slow')
    """
    if order_after is not None and order_after >= _ORDER_SLOW:
        return "slow"
    if order_after is not None and order_after <= _ORDER_CLOCK:
        return "clock"
    if spell or grows or kinds:
        return "slow"
    return "clock_or_constant_delay"


_CLOCK_CHECK = (
    "compare the hosts' clocks: `chronyc tracking` (System time, Last offset) or "
    "`timedatectl timesync-status` on each host, or the PTP daemon's offset (`pmc -u -b 0 "
    "'GET CURRENT_DATA_SET'`)"
)


def host_findings(metric: pl.DataFrame, ctx: Context) -> list[Finding]:
    per = _host_instances(ctx)
    if per.is_empty():
        return []
    gaps = metric.group_by("comm_key").agg(pl.col("gap_s").first(), pl.col("members").max())
    # The communicator with the most members first; each host is reported once.
    comms = gaps.sort("members", descending=True).iter_rows(named=True)
    out: list[Finding] = []
    done: set[str] = set()
    spans = per.group_by("comm_key").agg(
        pl.col("host").unique().sort().str.join("\n").alias("span")
    )
    for c in comms:
        sub = per.filter(pl.col("comm_key") == c["comm_key"])
        if sub.is_empty():
            continue
        effect = max(MIN_SLOWDOWN * float(c["gap_s"] or 0.0), MIN_EXCESS_S)
        spread = _kind_spreads(per, spans, str(c["comm_key"]), effect)
        for (host,), g in sub.group_by(["host"], maintain_order=True):
            if host in done or g.height < MIN_INSTANCES:
                continue
            f = _host_finding(ctx, c, str(host), g, metric, spread.get(str(host)))
            if f is not None:
                out.append(f)
                done.add(str(host))
    out = _mirrored_spells(out)
    slow = [f for f in out if f.evidence["cause"] == "slow"]
    by_cause: dict[str, list[Finding]] = {}
    for f in out:
        if f.evidence["cause"] != "slow":
            by_cause.setdefault(f.evidence["cause"], []).append(f)
    return slow + [fs[0] if len(fs) == 1 else _merged(fs) for fs in by_cause.values()]


def _mirrored_spells(found: list[Finding]) -> list[Finding]:
    """Spells of slowness on several hosts of one communicator, kept where the
    lateness inside the window grows with the compute gap.

    Hosts are compared with each other, so one host's spell is the others' dip: with
    two hosts, A late over a stretch reads exactly as B late over the rest (plus a
    clock offset), and either shows as a spell when the stretch holds most of the
    kept log.  A slow node's lateness inside its window grows with the compute before
    each collective; the mirror's "window" is the other host's normal stretch, where
    its lateness is its clock, flat.  Where no spell (or every one) grows, the logs
    cannot say which host was slow: one ``info`` finding names the hosts, blaming
    none."""
    spells: dict[str, list[Finding]] = {}
    for f in found:
        if f.evidence.get("cause") == "slow" and f.evidence.get("intermittent"):
            spells.setdefault(str(f.evidence["communicator"]), []).append(f)
    drop: set[int] = set()
    add: list[Finding] = []
    for fs in spells.values():
        if len(fs) < 2:
            continue
        grown = [f for f in fs if f.evidence.get("window_grows_with_gap")]
        drop |= {id(f) for f in fs if len(grown) != 1 or f is not grown[0]}
        if len(grown) != 1:
            add.append(_ambiguous_spell(fs))
    return [f for f in found if id(f) not in drop] + add


def _host_finding(
    ctx: Context,
    comm: dict[str, Any],
    host: str,
    g: pl.DataFrame,
    metric: pl.DataFrame,
    kinds: KindSpread | None = None,
) -> Finding | None:
    xs: list[float] = g["delta_s"].to_list()
    times = g["at"]
    gap = float(comm["gap_s"] or 0.0)
    effect = max(MIN_SLOWDOWN * gap, MIN_EXCESS_S)
    # Sorted by polars, not Python: the same values as ``statistics.median``,
    # ``mad`` and ``quantile`` of ``xs``, at a fraction of the cost per host.
    ordered = g["delta_s"].sort()
    shift = sorted_median(ordered)
    noise = sorted_median((ordered - shift).abs().sort()) * 1.4826
    se = 1.253 * max(noise, 1e-6) / math.sqrt(len(xs))
    whole = shift >= effect and shift / se >= MIN_Z
    # The level where the host was not late: its lower decile.  Lateness only adds,
    # and a spell that holds most of the log puts the median inside the spell.
    base = float(ordered[min(len(xs) - 1, int(0.1 * len(xs)))])
    w = find_window(xs, base, effect)
    spell = w is not None and (w.last - w.first + 1) < WHOLE_RUN * len(xs)
    merged = g.filter(pl.col("merged"))
    behind = _clock_behind(merged, shift, effect)
    grows = _grows_with_gap(g, effect)
    if not whole and not spell and not behind and grows is None and kinds is None:
        return None
    order_after: float | None = None
    first_after = 0.0
    if merged.height >= MIN_INSTANCES:
        sel = (
            merged
            if not spell or w is None
            else merged.filter(pl.col("seq").is_between(g["seq"][w.first], g["seq"][w.last]))
        )
        if sel.height >= MIN_INSTANCES or (spell and sel.height >= MIN_WINDOW):
            after = (sel["pos"] > sel["ref_pos"]).sum()
            order_after = int(after) / sel.height
            first_after = int((sel["pos_first"] > sel["ref_pos"]).sum()) / sel.height
    cause = _cause(order_after, spell, grows is not None, kinds is not None)
    if behind and not whole and not spell:
        return _behind_finding(ctx, comm, host, g, metric, shift, order_after or 0.0)
    if not whole and not spell and cause != "slow":
        return None
    by_order = order_after is not None and order_after >= _ORDER_SLOW
    if cause == "slow" and (
        # Its ranks are not late together: one of them is (named on its own against
        # its host's others, one clock); a node is not slow for one bad rank.  Where
        # the order said "slow", its times carry its clock: the order says it, by
        # the host's first line coming after the others' too.
        (by_order and first_after < _ORDER_SLOW)
        or (
            not by_order
            and not _together(
                g,
                w if spell else None,
                shift if kinds is None else max(shift, kinds.spread_s),
                grows,
                gap,
            )
        )
    ):
        return None
    members = metric.filter((pl.col("comm_key") == comm["comm_key"]) & (pl.col("host") == host))
    ranks = sorted(int(r) for r in members["rank"].drop_nulls().to_list())
    everyone = int(comm["members"] or 0)
    ev = window_evidence(ctx, w if spell else None, xs, times, base, None)
    lost = ev.get("window_cost_s", 0.0) if cause == "slow" else 0.0
    if spell and w is not None:
        excess = w.excess_s
    elif grows is not None and gap:
        # The growth with the gap is the node's own slowdown, whatever its clock:
        # its lateness at a typical collective, and the rest of the shift is the clock.
        excess = grows[2] * gap
    elif kinds is not None and cause == "slow":
        # What no clock enters: the latest kind's lateness over the earliest's.
        excess = kinds.spread_s
    else:
        excess = shift
    slowdown = excess / gap if gap else None
    first = members.sort("line_no").row(0, named=True) if members.height else None
    evidence: dict[str, Any] = {
        "communicator": comm["comm_key"],
        "cause": cause,
        "compared_with": "hosts",
        "unit": "host",
        "ranks": ranks,
        "instances": len(xs),
        "sampled_every": ctx.stride,
        "median_lateness_s": round(shift, 6),
        "lateness_noise_s": round(noise, 6),
        "median_gap_s": round(gap, 6) if gap else None,
        "slowdown": round(slowdown, 4) if slowdown is not None else None,
        "order_after": round(order_after, 4) if order_after is not None else None,
        "intermittent": spell,
        **ev,
    }
    if grows is not None:
        evidence["lateness_after_long_gaps_s"] = round(grows[0], 6)
        evidence["lateness_after_short_gaps_s"] = round(grows[1], 6)
        if not spell:
            evidence["clock_offset_estimate_s"] = round(shift - excess, 6)
    if kinds is not None:
        evidence["lateness_by_kind"] = [
            {"communicator": k, "op": op, "median_lateness_s": round(m, 6), "instances": n}
            for k, op, m, n in kinds.groups
        ]
        evidence["kind_spread_s"] = round(kinds.spread_s, 6)
        evidence["kind_spread_z"] = round(kinds.z, 1)
    if spell and w is not None:
        evidence["window_excess_s"] = round(w.excess_s, 6)
        evidence["window_z"] = round(w.z, 1)
        inside = _grows_with_gap(g.slice(w.first, w.last - w.first + 1), effect)
        evidence["window_grows_with_gap"] = inside is not None
    severity, msg = _host_verdict(host, ranks, cause, excess, slowdown, evidence)
    if cause == "slow":
        evidence["window_cost_gpu_s"] = round(lost * max(0, everyone - len(ranks)), 3)
    else:
        evidence["check"] = _CLOCK_CHECK
    return Finding(
        kind="straggler",
        severity=severity,
        message=msg,
        ranks=ranks if cause == "slow" else [],
        hosts=[host],
        evidence=evidence,
        lines=[LineRef(int(first["file_id"]), int(first["line_no"]))] if first else [],
        cost_gpu_s=evidence.get("window_cost_gpu_s") if cause == "slow" else None,
    )


@dataclass(frozen=True)
class KindSpread:
    """A host's lateness by collective kind (and communicator): ``groups`` as
    (communicator, op, median lateness, instances), the spread between the latest and
    the earliest group's medians and its z (their difference over the root of the sum
    of their squared robust standard errors)."""

    groups: list[tuple[str, str, float, int]]
    spread_s: float
    z: float


def _kind_spreads(
    per: pl.DataFrame, spans: pl.DataFrame, comm_key: str, effect: float
) -> dict[str, KindSpread]:
    """The host, if any, whose lateness differs between collective kinds (op x
    communicator) by ``effect`` and ``MIN_Z`` robust standard errors, over the
    communicators spanning exactly the hosts ``comm_key`` spans (each host is measured
    against the same others in all of them; a host's own communicators have none).

    A clock offset shifts every stamp of a host alike, at every kind; a slow GPU loses
    more before the collectives that follow more compute (a backward layer, not the
    gradient norm).  Hosts are measured against each other, so the slow host's kinds
    move the others' lateness too (the mirror image with two hosts, half of it with
    three); the host with the largest spread is the slow one, and of two mirror
    images the one late at the kinds that follow its longest compute (its own gap from
    the previous collective: a slow GPU loses most where it computes most; its mirror is
    early there), then the one stamped later."""
    span = spans.filter(pl.col("comm_key") == comm_key)["span"]
    if span.is_empty():
        return {}
    keys = spans.filter(pl.col("span") == span[0])["comm_key"]
    rows = per.filter(pl.col("comm_key").is_in(keys.implode()) & pl.col("op").is_not_null())
    d = pl.col("delta_s")
    stats = (
        rows.group_by("host", "comm_key", "op")
        .agg(
            pl.len().alias("n"),
            d.median().alias("m"),
            ((d - d.median()).abs().median() * 1.4826).alias("mad"),
            pl.col("own_gap_s").median().alias("gap"),
        )
        .filter(pl.col("n") >= _MIN_GROUP)
        .sort("host", "m", "comm_key", "op")
    )
    shifts = dict(rows.group_by("host").agg(d.median()).iter_rows())
    found: dict[str, KindSpread] = {}
    follows: dict[str, float] = {}
    for (host,), g in stats.group_by(["host"], maintain_order=True):
        if g.height < 2:
            continue
        timed = g.filter(pl.col("gap").is_not_null()).sort("gap")
        if timed.height >= 2:
            follows[str(host)] = float(timed["m"][-1]) - float(timed["m"][0])
        lo, hi = g.row(0, named=True), g.row(-1, named=True)
        se = [1.253 * max(float(r["mad"]), 1e-6) / math.sqrt(int(r["n"])) for r in (lo, hi)]
        diff = float(hi["m"]) - float(lo["m"])
        z = diff / math.hypot(*se)
        if diff >= effect and z >= MIN_Z:
            groups = [
                (str(r["comm_key"]), str(r["op"]), float(r["m"]), int(r["n"]))
                for r in g.iter_rows(named=True)
            ]
            found[str(host)] = KindSpread(groups, diff, z)
    if not found:
        return {}

    def rank(h: str) -> tuple[float, float, float]:
        # Of mirror images, the slow host is late at the kinds that follow the longest
        # compute (its own time from the previous collective, its clock cancelled); its
        # mirror is early at them.
        return round(found[h].spread_s, 6), follows.get(h, 0.0), shifts.get(h) or 0.0

    # By the spread itself, not its z (which the noise of a few instances decides once
    # every host's stands): to the microsecond, so that mirror images tie.
    top = max(found, key=rank)
    return {top: found[top]}


def _kind_text(k: dict[str, Any], many: bool) -> str:
    return f"{k['op']} on communicator {k['communicator']}" if many else str(k["op"])


def _kinds_why(ev: dict[str, Any]) -> str:
    """Why a host whose lateness differs between collective kinds is slow."""
    by = ev["lateness_by_kind"]
    hi = max(by, key=lambda k: k["median_lateness_s"])
    lo = min(by, key=lambda k: k["median_lateness_s"])
    many = len({k["communicator"] for k in by}) > 1
    return (
        f"its lateness differs between collective kinds: "
        f"{duration_text(hi['median_lateness_s'])} at {_kind_text(hi, many)}, "
        f"{duration_text(lo['median_lateness_s'])} at {_kind_text(lo, many)}, where a "
        f"clock offset shifts every stamp of the host alike; its clock may add to or take "
        f"from what its times show, but {duration_text(ev['kind_spread_s'])} of it is the node's"
    )


def _together(
    g: pl.DataFrame,
    w: Window | None,
    shift: float,
    grows: tuple[float, float, float] | None,
    gap: float,
) -> bool:
    """The host's ranks are late together: its first member is late too.  The
    host's typical member came ``inner_s`` after its first (one clock); that must be
    under half of the host's lateness (the lateness of its window, of its growth with
    the gap at a typical collective, or its shift), else most of it is one or a few
    of its ranks, not the node.

    >>> import polars as pl
    >>> _together(pl.DataFrame({"inner_s": [0.0002] * 30}), None, 0.01, None, 0.1)
    True
    >>> _together(pl.DataFrame({"inner_s": [0.005] * 30}), None, 0.01, None, 0.1)
    False
    """
    inner = g["inner_s"].to_list()
    if w is not None:
        inner = inner[w.first : w.last + 1]
        late = w.excess_s
    elif grows is not None and gap:
        # Both grow with the gap for a lone late rank: compare at a typical one.
        late = grows[2] * gap
    else:
        late = shift
    return bool(inner) and statistics.median(inner) < late / 2


def _grows_with_gap(g: pl.DataFrame, effect: float) -> tuple[float, float, float] | None:
    """The host's median lateness after its longest gaps between collectives (the
    instances whose gap from its previous one, by its own clock, is at least 1.5 times
    its median: a step boundary, an optimizer step) and after the others, where the
    first exceeds the second by ``effect`` and ``MIN_Z`` robust standard errors: a
    slower node loses more time in a longer compute phase, a clock the same
    everywhere (a slow node arrives last, so its own gap is its compute).  The
    third value is the growth per second of gap (long minus short, by the host's own
    clock): the node's slowdown as a share of the time between collectives, which no
    clock offset enters."""
    sub = g.filter(pl.col("own_gap_s").is_not_null())
    if sub.height < 2 * MIN_WINDOW:
        return None
    typical = sub["own_gap_s"].median()
    if not isinstance(typical, float) or typical <= 0:
        return None
    is_long = pl.col("own_gap_s") >= 1.5 * typical
    long = sub.filter(is_long)["delta_s"].to_list()
    short = sub.filter(~is_long)["delta_s"].to_list()
    if len(long) < _MIN_GROUP or len(short) < _MIN_GROUP:
        return None
    hi, lo = statistics.median(long), statistics.median(short)
    se = 1.253 * max(mad(short, lo), mad(long, hi), 1e-6) / math.sqrt(len(long))
    if hi - lo < effect or (hi - lo) / se < MIN_Z:
        return None
    g_long = sub.filter(is_long)["own_gap_s"].median()
    g_short = sub.filter(~is_long)["own_gap_s"].median()
    if not isinstance(g_long, float) or not isinstance(g_short, float):
        return None
    return hi, lo, (hi - lo) / (g_long - g_short)


def _clock_behind(merged: pl.DataFrame, shift: float, effect: float) -> bool:
    """The merged log shows the host after the others at collective after collective
    (binomial z of at least ``MIN_Z`` against the half that simultaneous arrivals
    give), while its times do not say it came ``effect`` after them: the node is late
    and its clock behind by about as much, amounts these logs cannot separate."""
    n = merged.height
    if n < MIN_INSTANCES or shift >= effect:
        return False
    after = int((merged["pos"] > merged["ref_pos"]).sum())
    # Its ranks late together: even its first line comes after the others' (one late
    # rank of a host of two puts the host's median line after theirs on its own).
    first = int((merged["pos_first"] > merged["ref_pos"]).sum())
    return min(after, first) / n >= _ORDER_SLOW and (after - n / 2) / math.sqrt(n / 4) >= MIN_Z


def _behind_finding(
    ctx: Context,
    comm: dict[str, Any],
    host: str,
    g: pl.DataFrame,
    metric: pl.DataFrame,
    shift: float,
    order_after: float,
) -> Finding:
    members = metric.filter((pl.col("comm_key") == comm["comm_key"]) & (pl.col("host") == host))
    ranks = sorted(int(r) for r in members["rank"].drop_nulls().to_list())
    first = members.sort("line_no").row(0, named=True) if members.height else None
    times = g["at"]
    return Finding(
        kind="straggler",
        severity="warning",
        message=(
            f"host {host} (ranks {ranks_text(ranks)}) is slow: its lines come after the "
            f"other hosts' in the merged log at {order_after:.0%} of collectives, yet its "
            f"clock stamps them {duration_text(abs(shift))} "
            f"{'before' if shift < 0 else 'after'} theirs: its clock is behind theirs, "
            f"and how late the node is cannot be read from the times; {_CLOCK_CHECK}"
        ),
        ranks=ranks,
        hosts=[host],
        evidence={
            "communicator": comm["comm_key"],
            "cause": "slow",
            "clock_behind": True,
            "compared_with": "hosts",
            "unit": "host",
            "ranks": ranks,
            "instances": g.height,
            "sampled_every": ctx.stride,
            "median_lateness_s": round(shift, 6),
            "order_after": round(order_after, 4),
            "slowdown": None,
            "intermittent": False,
            "window_start": iso(times[0]),
            "window_end": iso(times[-1]),
            "window_whole_run": True,
            "check": _CLOCK_CHECK,
        },
        lines=[LineRef(int(first["file_id"]), int(first["line_no"]))] if first else [],
    )


def _host_verdict(
    host: str,
    ranks: list[int],
    cause: str,
    excess: float,
    slowdown: float | None,
    ev: dict[str, Any],
) -> tuple[Severity, str]:
    who = f"host {host} (ranks {ranks_text(ranks)})" if ranks else f"host {host}"
    share = f", {slowdown:.0%} of the gap between collectives" if slowdown else ""
    if cause == "slow":
        when = f" from {ev['window_start']} to {ev['window_end']}" if ev.get("intermittent") else ""
        if (ev.get("order_after") or 0.0) >= _ORDER_SLOW:
            why = (
                "its lines come after the other hosts' in the merged log; the times "
                "include any offset of its clock"
            )
        elif ev.get("intermittent"):
            why = "its lateness comes and goes, which a clock offset does not"
        elif "lateness_after_long_gaps_s" not in ev and "lateness_by_kind" in ev:
            why = _kinds_why(ev)
        else:
            why = (
                f"its lateness grows with the compute before the collective: "
                f"{duration_text(ev['lateness_after_long_gaps_s'])} after the longest "
                f"gaps, {duration_text(ev['lateness_after_short_gaps_s'])} after the "
                f"others, which a clock offset does not do"
            )
            clock = ev.get("clock_offset_estimate_s") or 0.0
            if abs(clock) >= MIN_EXCESS_S:
                why += (
                    f"; the rest of what its times show, {duration_text(abs(clock))} "
                    f"{'ahead' if clock > 0 else 'behind'}, is its clock"
                )
        critical = slowdown is not None and slowdown >= CRITICAL_SLOWDOWN
        sev: Severity = "critical" if critical and not ev.get("intermittent") else "warning"
        return sev, (
            f"{who} is slow: its ranks arrive {duration_text(excess)} after the other "
            f"hosts' at collectives{when}{share} ({why})"
        )
    if cause == "clock":
        sev = "warning" if abs(excess) >= _BROKEN_CLOCK_S else "info"
        return sev, (
            f"host clocks differ by {duration_text(abs(excess))}: {who}'s times run "
            f"ahead of the other hosts', but its lines do not come after theirs in the "
            f"merged log (a clock offset, not a slow node); {_CLOCK_CHECK}"
        )
    sev = "warning" if abs(excess) >= _UNSYNCED_S else "info"
    return sev, (
        f"{who}'s collectives are stamped {duration_text(excess)} after the other "
        f"hosts'{share}, the same at every collective: either its clock is "
        f"{duration_text(excess)} ahead or the node is slow by a constant delay; these "
        f"logs cannot tell them apart (no merged log, no change over time); "
        f"{_CLOCK_CHECK}"
    )


def _merged(findings: list[Finding]) -> Finding:
    """One finding for several hosts whose shift has the same cause (a clock, or a clock
    or a constant delay): a job whose clocks all differ a little says it once."""
    fs = sorted(findings, key=lambda f: -abs(f.evidence["median_lateness_s"]))
    cause = fs[0].evidence["cause"]
    worst = max((f.severity for f in fs), key=SEVERITIES.index)
    shifts = ", ".join(f"{f.hosts[0]} {f.evidence['median_lateness_s'] * 1000:+.1f} ms" for f in fs)
    what = (
        "a clock offset (their lines do not come after the others' in the merged log)"
        if cause == "clock"
        else "either a clock offset or a constant delay (these logs cannot tell them apart)"
    )
    return Finding(
        kind="straggler",
        severity=worst,
        message=(
            f"{len(fs)} hosts' collectives are stamped after the other hosts' ({shifts}), "
            f"the same at every collective: {what}; {_CLOCK_CHECK}"
        ),
        ranks=[],
        hosts=sorted(f.hosts[0] for f in fs),
        evidence={
            "communicator": fs[0].evidence["communicator"],
            "cause": cause,
            "compared_with": "hosts",
            "unit": "host",
            "check": _CLOCK_CHECK,
            "by_host": [
                {
                    "host": f.hosts[0],
                    "ranks": f.evidence["ranks"],
                    "median_lateness_s": f.evidence["median_lateness_s"],
                    "order_after": f.evidence["order_after"],
                }
                for f in fs
            ],
        },
        lines=[ln for f in fs for ln in f.lines[:1]],
    )


def _ambiguous_spell(findings: list[Finding]) -> Finding:
    """Spells on several hosts that mirror each other, none told from the others."""
    hosts = sorted(f.hosts[0] for f in findings)
    windows = "; ".join(
        f"{f.hosts[0]} from {f.evidence['window_start']} to {f.evidence['window_end']}"
        for f in findings
    )
    return Finding(
        kind="straggler",
        severity="info",
        message=(
            f"hosts {', '.join(hosts)} arrived late against each other for a while "
            f"({windows}): one of them was slow then, but as each is measured against the "
            f"others (their clocks differ), a stretch of one host's lateness reads as the "
            f"rest of the run's on the other, and its lateness did not grow with the "
            f"compute before each collective as a slow node's does; look at the hosts' "
            f"step times or GPU clocks over those windows"
        ),
        ranks=[],
        hosts=hosts,
        evidence={
            "communicator": findings[0].evidence["communicator"],
            "cause": "slow_unattributed",
            "compared_with": "hosts",
            "unit": "host",
            "intermittent": True,
            "by_host": [
                {
                    "host": f.hosts[0],
                    "ranks": f.evidence["ranks"],
                    "window_start": f.evidence["window_start"],
                    "window_end": f.evidence["window_end"],
                    "window_excess_s": f.evidence.get("window_excess_s"),
                }
                for f in findings
            ],
        },
        lines=[ln for f in findings for ln in f.lines[:1]],
    )

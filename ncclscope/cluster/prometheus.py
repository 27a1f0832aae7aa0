"""A small, bounded client of Prometheus' HTTP API (stdlib ``urllib`` only).

Every request is kept as an :class:`~ncclscope.cluster.tables.Ask`: what was asked, how
it ended (``ok``, ``partial``, ``truncated``, ``error``, ``timeout``, ``unreachable``),
how many series and samples came back and how long it took.  Nothing here raises on a
network, HTTP or JSON problem: a malformed answer is an ``error`` ask with no series.

Bounds: Prometheus' own ``timeout`` parameter (it stops evaluating and answers with an
error document) and, a little longer, the client's socket timeout (a server that does not
answer at all); at most ``max_series`` series are kept per answer (the rest dropped, the
ask ``truncated``).  Values are parsed as Prometheus writes them (``"NaN"``, ``"+Inf"``);
non-finite values are dropped and counted (``PromClient.nonfinite``).

Credentials, for a Prometheus behind an authenticating proxy: a user and password in
the URL (``https://user:pass@prom.example:443``) go as HTTP Basic authentication, a
``token`` as a bearer token (a Kubernetes service account's, as Prometheus'
``bearer_token_file``); the password is never said (``url`` shows ``user:***@``), nor
the token.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl

from ncclscope.cluster.tables import Ask, AskStatus

__all__ = ["Answer", "PromClient", "Series"]

#: The client's socket waits longer than Prometheus' own ``timeout`` (half as long again,
#: 2 s at most), so that a query Prometheus gives up on comes back as its error document.
_SOCKET_GRACE_MAX_S = 2.0
#: Error text kept per ask (Prometheus can quote a whole query back).
_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class Series:
    """One series of an answer: its labels (``__name__`` included where Prometheus kept
    it), its times (Unix seconds) and finite values."""

    labels: dict[str, str]
    ts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Answer:
    """What one request brought back: its ask and series (none unless it answered)."""

    ask: Ask
    series: list[Series] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.ask.status in ("ok", "partial", "truncated")


class _MalformedError(Exception):
    """An answer that is not Prometheus' JSON document."""


def _when(at: datetime) -> str:
    return f"{at.timestamp():.3f}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _credentials(url: str) -> tuple[str, str, str | None]:
    """``url`` less its user and password, as it may be shown, and the Basic
    authorization they make (None without).

    >>> _credentials("https://ops:s3cret@prom.example:9090/prom/")[:2]
    ('https://prom.example:9090/prom', 'https://ops:***@prom.example:9090/prom')
    """
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    if parts.username is None or "@" not in parts.netloc:
        return url.rstrip("/"), url.rstrip("/"), None
    host = parts.netloc.rsplit("@", 1)[1]
    bare = urllib.parse.urlunsplit(parts._replace(netloc=host))
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    shown = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    return bare, shown, f"Basic {basic}"


class PromClient:
    """Prometheus at ``url`` (``http://host:9090``, a path prefix kept; a user and
    password in it are sent as Basic authentication), ``token`` a bearer token.
    ``url`` is the address as it may be shown (no password); ``asks`` holds every
    request made, in order; ``nonfinite`` the values dropped as NaN or infinite."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        max_series: int = 20000,
        token: str | None = None,
    ) -> None:
        self._base, self.url, basic = _credentials(url)
        self._headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif basic:
            self._headers["Authorization"] = basic
        self.timeout_s = float(timeout_s)
        self.socket_s = self.timeout_s + min(_SOCKET_GRACE_MAX_S, self.timeout_s / 2)
        self.max_series = int(max_series)
        self.asks: list[Ask] = []
        self.nonfinite = 0
        self._lock = threading.Lock()  # requests may run from several threads

    # ------------------------------------------------------------------ requests

    def range(
        self,
        expr: str,
        start: datetime,
        end: datetime,
        step_s: float,
        *,
        what: str = "query_range",
    ) -> Answer:
        """``/api/v1/query_range``: ``expr`` from ``start`` to ``end`` every ``step_s``."""
        params = {"query": expr, "start": _when(start), "end": _when(end), "step": f"{step_s:g}"}
        return self._ask(what, "query_range", params, expr, start, end, step_s)

    def instant(self, expr: str, at: datetime, *, what: str = "query") -> Answer:
        """``/api/v1/query``: ``expr`` at ``at``."""
        params = {"query": expr, "time": _when(at)}
        return self._ask(what, "query", params, expr, at, at, None)

    def series(
        self, matches: Sequence[str], start: datetime, end: datetime, *, what: str = "series"
    ) -> Answer:
        """``/api/v1/series``: the label sets of the series ``matches`` select between
        ``start`` and ``end`` (no samples)."""
        params: list[tuple[str, str]] = [("match[]", m) for m in matches]
        params += [("start", _when(start)), ("end", _when(end))]
        return self._ask(what, "series", params, " , ".join(matches), start, end, None)

    # ------------------------------------------------------------------ plumbing

    def _ask(
        self,
        what: str,
        endpoint: str,
        params: dict[str, str] | list[tuple[str, str]],
        expr: str,
        start: datetime | None,
        end: datetime | None,
        step_s: float | None,
    ) -> Answer:
        t0 = time.monotonic()
        items = list(params.items()) if isinstance(params, dict) else list(params)
        if endpoint != "series":
            items.append(("timeout", f"{self.timeout_s:g}s"))
        status: AskStatus
        series: list[Series] = []
        samples = 0
        message: str | None = None
        body, status, message = self._post(f"{self._base}/api/v1/{endpoint}", items)
        if body is not None:
            try:
                status, message, series = self._read(body, endpoint, status, message)
            except _MalformedError as err:
                # An HTTP error's page (a proxy's) is no document: its status says more.
                said = message if status == "error" and message else f"malformed answer: {err}"
                status, message, series = "error", said, []
            samples = sum(len(s.values) for s in series)
        ask = Ask(
            what=what,
            expr=expr,
            start=start,
            end=end,
            step_s=step_s,
            status=status,
            series=len(series),
            samples=samples,
            seconds=round(time.monotonic() - t0, 3),
            message=_short(message) if message else None,
        )
        with self._lock:
            self.asks.append(ask)
        return Answer(ask, series)

    def _post(
        self, url: str, items: list[tuple[str, str]]
    ) -> tuple[bytes | None, AskStatus, str | None]:
        """The answer's body (an error document's too) or None, and how it ended."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return None, "unreachable", f"not an http(s) URL: {self.url!r}"
        data = urllib.parse.urlencode(items).encode()
        request = urllib.request.Request(url, data=data, method="POST", headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.socket_s) as r:
                return r.read(), "ok", None
        except urllib.error.HTTPError as err:
            try:
                body = err.read()
            except (OSError, http.client.HTTPException):
                body = b""
            finally:
                err.close()
            said = f"HTTP {err.code} {err.reason}"
            if err.code in (401, 403):
                said += (
                    ": Prometheus wants credentials (a user and password in the URL, "
                    "https://user:pass@host, or --prometheus-token-file)"
                    if "Authorization" not in self._headers
                    else ": the credentials given were refused"
                )
            return body or None, "error", said
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                return None, "timeout", f"no answer in {self.socket_s:g} s"
            return None, "unreachable", str(err.reason)
        except TimeoutError:
            return None, "timeout", f"no answer in {self.socket_s:g} s"
        except (OSError, http.client.HTTPException, ValueError) as err:
            return None, "unreachable", f"{type(err).__name__}: {err}"

    def _read(
        self, body: bytes, endpoint: str, status: AskStatus, message: str | None
    ) -> tuple[AskStatus, str | None, list[Series]]:
        fast = _fast_matrix(body) if endpoint == "query_range" and status == "ok" else None
        if fast is not None:
            labels, sizes, times, texts, warnings = fast
            try:
                return self._outcome(self._build(labels, sizes, times, texts), warnings)
            except _MalformedError:
                pass  # read again the slow way, which says what is wrong
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            if status == "error":  # an HTTP error with a body that is not Prometheus'
                return status, message, []
            raise _MalformedError(f"not JSON ({err})") from None
        if not isinstance(doc, dict):
            raise _MalformedError("not a JSON object")
        if doc.get("status") != "success":
            kind = str(doc.get("errorType", "")) or "error"
            text = str(doc.get("error", "")) or (message or "no error text")
            ended: AskStatus = "timeout" if kind in ("timeout", "canceled") else "error"
            return ended, f"{kind}: {text}", []
        data = doc.get("data")
        series = self._series(data) if endpoint == "series" else self._result(data)
        return self._outcome(series, doc.get("warnings"))

    def _outcome(
        self, series: list[Series], warnings: Any
    ) -> tuple[AskStatus, str | None, list[Series]]:
        out: AskStatus = "ok"
        said: str | None = None
        if isinstance(warnings, list) and warnings:
            out, said = "partial", "; ".join(str(w) for w in warnings)
        if len(series) > self.max_series:
            cut = len(series) - self.max_series
            series = series[: self.max_series]
            out = "truncated"
            more = f"{cut} series past the limit of {self.max_series} dropped"
            said = f"{more}; {said}" if said else more
        return out, said, series

    def _series(self, data: Any) -> list[Series]:
        if not isinstance(data, list):
            raise _MalformedError("data is not a list of label sets")
        return [Series(_labels(x)) for x in data]

    def _result(self, data: Any) -> list[Series]:
        if not isinstance(data, dict):
            raise _MalformedError("no data object")
        kind, result = data.get("resultType"), data.get("result")
        if not isinstance(result, list):
            raise _MalformedError("no result list")
        if kind not in ("matrix", "vector"):
            raise _MalformedError(f"result type {kind!r}")
        labels: list[dict[str, str]] = []
        sizes: list[int] = []
        times: list[Any] = []
        texts: list[Any] = []
        for item in result:
            if not isinstance(item, dict):
                raise _MalformedError("a result that is not an object")
            labels.append(_labels(item.get("metric", {})))
            pairs = item.get("values") if kind == "matrix" else [item.get("value")]
            if not isinstance(pairs, list):
                raise _MalformedError("a series without values")
            try:
                times.extend([p[0] for p in pairs])
                texts.extend([p[1] for p in pairs])
            except (TypeError, KeyError, IndexError):
                raise _MalformedError("a sample that is not [time, value]") from None
            sizes.append(len(pairs))
        return self._build(labels, sizes, times, texts)

    def _build(
        self, labels: list[dict[str, str]], sizes: list[int], times: list[Any], texts: list[Any]
    ) -> list[Series]:
        """Series from their labels, sizes and every sample's time and value text."""
        ts, values = _floats(times, texts)
        ok = ts.is_finite() & values.is_finite()
        bad = len(ok) - int(ok.sum())
        with self._lock:
            self.nonfinite += bad
        t_list, v_list = ts.to_list(), values.to_list()
        keep = ok.to_list() if bad else None
        out: list[Series] = []
        at = 0
        for lab, n in zip(labels, sizes, strict=True):
            t_part, v_part = t_list[at : at + n], v_list[at : at + n]
            if keep is not None:
                k_part = keep[at : at + n]
                t_part = [t for t, k in zip(t_part, k_part, strict=True) if k]
                v_part = [v for v, k in zip(v_part, k_part, strict=True) if k]
            out.append(Series(lab, t_part, v_part))
            at += n
        return out


def _floats(times: list[Any], texts: list[Any]) -> tuple[pl.Series, pl.Series]:
    """Times (numbers) and values (strings, as Prometheus writes them: ``"1e+09"``,
    ``"NaN"``, ``"+Inf"``) as floats, in bulk; anything else is malformed.  Both may
    also be the answer's own bytes (:func:`_fast_matrix`)."""
    try:
        if times and isinstance(times[0], bytes):
            ts = (
                pl.Series("t", times, dtype=pl.Binary)
                .cast(pl.String)
                .cast(pl.Float64, strict=False)
            )
        else:
            ts = pl.Series("t", times, dtype=pl.Float64, strict=False)
        if texts and isinstance(texts[0], bytes):
            raw = pl.Series("v", texts, dtype=pl.Binary).cast(pl.String, strict=False)
        else:
            raw = pl.Series("v", texts, dtype=pl.String, strict=False)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        raise _MalformedError("a sample that is not numbers") from None
    values = raw.cast(pl.Float64, strict=False)
    if ts.null_count() or values.null_count():
        raise _MalformedError('a sample that is not [time, "value"]')
    return ts, values


#: How Prometheus (Go's encoding/json, compact) begins a range query's answer, each
#: series, and its values; one sample (a value is a number's text, ``NaN`` or ``±Inf``).
_HEAD = b'{"status":"success","data":{"resultType":"matrix","result":['
_ITEM = b'{"metric":'
_VALUES = b',"values":['
_PAIR = re.compile(rb'\[([-+0-9.eE]+),"([-+0-9.eEaINnfy]*)"\]')


def _fast_matrix(
    body: bytes,
) -> tuple[list[dict[str, str]], list[int], list[bytes], list[bytes], Any] | None:
    """A range query's answer read without decoding every sample as JSON (a 1,024-GPU
    job's answers hold millions): each series' labels by ``json``, its samples by one
    regular expression over its values.  None where the answer is not laid out exactly
    as Prometheus writes it (then it is read as JSON): a quote inside a JSON string is
    always escaped, so the markers cannot occur inside labels, and every ``[`` of a
    series' values must begin a sample read."""
    if not body.startswith(_HEAD):
        return None
    parts = body[len(_HEAD) :].split(_ITEM)
    if parts[0] != b"":
        rest = parts[0]
        if len(parts) > 1 or not rest.startswith(b"]}"):
            return None
        warned = _tail(rest[2:])
        return None if warned is False else ([], [], [], [], warned)  # no series
    labels: list[dict[str, str]] = []
    sizes: list[int] = []
    times: list[bytes] = []
    texts: list[bytes] = []
    warnings: Any = None
    last = len(parts) - 1
    for k, chunk in enumerate(parts[1:], 1):
        at = chunk.find(_VALUES)
        if at < 0:
            return None
        if k < last:
            if not chunk.endswith(b"]]},"):
                return None
            region = chunk[at + len(_VALUES) : -3]
        else:
            stop = chunk.rfind(b"]]}]}")
            if stop < 0:
                return None
            region = chunk[at + len(_VALUES) : stop + 1]
            warnings = _tail(chunk[stop + 5 :])
            if warnings is False:
                return None
        try:
            labels.append(_labels(json.loads(chunk[:at])))
        except (ValueError, _MalformedError):
            return None
        pairs = _PAIR.findall(region)
        if len(pairs) != region.count(b"["):
            return None
        sizes.append(len(pairs))
        times.extend([p[0] for p in pairs])
        texts.extend([p[1] for p in pairs])
    return labels, sizes, times, texts, warnings


def _tail(rest: bytes) -> Any:
    """What follows ``data`` (``}``, or its warnings and infos): the warnings, or False
    where it is not that."""
    if rest == b"}":
        return None
    if not rest.startswith(b","):
        return False
    try:
        doc = json.loads(b"{" + rest[1:])
    except ValueError:
        return False
    return doc.get("warnings") if isinstance(doc, dict) else False


def _labels(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise _MalformedError("labels that are not an object")
    return {str(k): str(v) for k, v in raw.items()}


def utc(ts: float) -> datetime:
    """A Prometheus time (Unix seconds) as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, UTC)

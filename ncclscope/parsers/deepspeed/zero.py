"""ZeRO and offload settings, read from wherever a DeepSpeed log states them.

Four sources, merged by :func:`merge_zero` in the order of :data:`ZERO_SOURCES`: the user
config JSON printed by the engine dump, the dump's ``zero_config`` repr, the optimizer's
init lines, and lines only ZeRO stage 3 prints.

Samples (init lines)::

    Reduce bucket size 500000000
    Creating torch.float16 ZeRO stage 3 optimizer
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ZERO_SOURCES",
    "OffloadSetting",
    "ZeroConfig",
    "ZeroFields",
    "loads_lines",
    "merge_zero",
    "offload_settings",
    "zero_from_json",
    "zero_from_repr",
    "zero_from_user_config",
]


# --------------------------------------------------------------------------------------
# ZeRO init lines and stage-3 markers

_BUCKET = r"(?P<v>[\d,.eE+]{1,40})\s*$"

#: ZeRO optimizer init lines (rank 0), the weakest source of :class:`ZeroConfig`.
#:
#: Samples: ``Reduce bucket size 500000000``, ``Allgather bucket size 500,000,000``,
#: ``Prefetch bucket size 50000000``, ``CPU Offload: True``,
#: ``Creating torch.float16 ZeRO stage 3 optimizer``
INIT_LINE_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("reduce_bucket_size", re.compile(rf"^Reduce bucket size {_BUCKET}", re.ASCII)),
    ("allgather_bucket_size", re.compile(rf"^Allgather bucket size {_BUCKET}", re.ASCII)),
    ("prefetch_bucket_size", re.compile(rf"^Prefetch bucket size {_BUCKET}", re.ASCII)),
    ("offload_optimizer", re.compile(r"^CPU Offload: (?P<v>True|False)\s*$", re.ASCII)),
    ("stage", re.compile(r"^Creating (?:\S{1,64} )?ZeRO stage (?P<v>\d) optimizer", re.ASCII)),
)

#: Lines only ZeRO stage 3 prints, the weakest source of its stage (a job whose config
#: dump and optimizer line were not kept, e.g. an excerpt around its offload setup):
#: its modules' logger headers, ``see_memory_usage`` labels of the parameter offload
#: (``DeepSpeedZeRoOffload``, ZeRO-3's parameter manager whether or not it offloads),
#: and the persistent-parameters count.
#:
#: Samples::
#:
#:     [2024-03-07 14:02:11,481] [INFO] [stage3.py:412:_setup_for_real_optimizer] optimizer
#:     state initialized
#:     [2024-03-07 14:02:10,003] [INFO] [utils.py:781:see_memory_usage] DeepSpeedZeRoOffload
#:     initialize [begin]
#:     Parameter Offload: Total persistent parameters: 92160 in 81 params
#:     [2024-03-07 14:02:09,990] [INFO] [logging.py:96:log_dist] [Rank 0] Creating ZeRO Offload
ZERO3_FILES = frozenset(
    {
        "stage3.py",
        "parameter_offload.py",
        "partition_parameters.py",
        "partitioned_param_coordinator.py",
    }
)
ZERO3_LABELS = ("DeepSpeedZeRoOffload initialize", "Stage 3 initialize")
ZERO3_PERSISTENT = "Parameter Offload: Total persistent parameters"
#: The engine's line for a stage-3 job without an optimizer (``DummyOptim``: inference,
#: or an optimizer the engine does not build).
ZERO3_ENGINE = "Creating ZeRO Offload"

_JSON_NONFINITE_RE = re.compile(r"(?<=[:\[,\s])(-?)(inf|nan)(?=\s*[,\]}]|\s*$)", re.MULTILINE)
_DEVICE_RE = re.compile(
    r"\bdevice=(?:'(?P<q>[^']*)'|\"(?P<dq>[^\"]*)\"|<\w+\.(?P<enum>\w+)[^>]*>|(?P<bare>\w+))"
)
_ENUM_INT_RE = re.compile(r":\s*(?P<v>\d+)>$")
_INT_RE = re.compile(r"-?\d{1,19}")
#: A JSON dump is a few KiB; more is not a config (and json.loads has to stop somewhere).
_MAX_JSON_CHARS = 1 << 22
_DEVICES = frozenset({"cpu", "nvme", "none"})
_I64 = (1 << 63) - 1


# --------------------------------------------------------------------------------------
# The merged configuration


@dataclass(frozen=True)
class ZeroConfig:
    """What the log says about ZeRO.

    ``offload_*`` is ``"cpu"``, ``"nvme"``, ``"none"`` (the config says offload is off) or
    ``None`` (unknown).  ``source`` names the best source seen: ``"json"`` (the user
    config printed after the dump) > ``"zero_config"`` (the effective pydantic config of
    the dump) > ``"init_lines"`` (the ZeRO optimizer's init lines); a field the best
    source lacks is taken from the next one.
    """

    stage: int | None
    offload_optimizer: str | None
    offload_param: str | None
    overlap_comm: bool | None
    reduce_bucket_size: int | None
    allgather_bucket_size: int | None
    prefetch_bucket_size: int | None
    source: str


def _as_int(value: object) -> int | None:
    """An integer from JSON or printed text: ``500000000``, ``5.000000e+08``, ``100,000,000``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_I64 <= value <= _I64 else None
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return _as_int(int(value))  # 1e300: no Int64 column holds it
        return None
    if not isinstance(value, str):
        return None
    text = value.strip().replace(",", "").replace("_", "")
    if _INT_RE.fullmatch(text):
        return _as_int(int(text))
    enum_value = _ENUM_INT_RE.search(text)  # <ZeroStageEnum.weights: 3>
    if enum_value:
        return _as_int(int(enum_value["v"]))
    if len(text) > 40:
        return None
    try:
        return _as_int(float(text))
    except ValueError:
        return None


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip() in ("True", "False", "true", "false"):
        return value.strip() in ("True", "true")
    return None


def _device(value: object) -> str | None:
    """An offload device: ``"cpu"``, ``"nvme"``, ``"none"`` (``None``/null = off) or unknown."""
    if value is None:
        return "none"
    if not isinstance(value, str):
        return None
    text = value.strip().strip("'\"").lower()
    if text in _DEVICES:
        return text
    if text == "null":
        return "none"
    m = re.search(r"offloaddeviceenum\.(\w+)", text)
    return m[1] if m and m[1] in _DEVICES else None


def _depth(text: str) -> int:
    """Brackets opened minus closed, outside JSON strings.

    >>> _depth('    "a{": {'), _depth('}, '), _depth('"}" ["')
    (1, -1, 1)
    """
    if '"' in text:
        text = _outside_strings(text)
    return text.count("{") + text.count("[") - text.count("}") - text.count("]")


def _outside_strings(text: str) -> str:
    """``text`` without its double-quoted strings (an unclosed one runs to the end).

    A scan with ``str.find``, not a regex: a string pattern retried at every quote of
    an unclosed ``"\\"\\"...`` run takes quadratic time.
    """
    out: list[str] = []
    pos = 0
    while (start := text.find('"', pos)) >= 0:
        out.append(text[pos:start])
        end = start + 1
        while (end := text.find('"', end)) >= 0:
            first = end  # the run of backslashes right before this quote
            while first > start + 1 and text[first - 1] == "\\":
                first -= 1
            if (end - first) % 2 == 0:  # not escaped: the string ends here
                break
            end += 1
        if end < 0:
            return "".join(out)
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _loads(text: str) -> object:
    """JSON as DeepSpeed prints it (``ScientificNotationEncoder`` writes ``inf`` bare)."""
    if len(text) > _MAX_JSON_CHARS:
        return None
    for attempt in (text, None):
        if attempt is None:
            attempt = _JSON_NONFINITE_RE.sub(
                lambda m: m[1] + ("Infinity" if m[2] == "inf" else "NaN"), text
            )
        try:
            return json.loads(attempt)
        except (ValueError, RecursionError):
            continue
    return None


def _split_top_level(text: str) -> list[str]:
    """Split a pydantic repr at spaces outside parentheses, brackets and quotes.

    >>> _split_top_level("stage=3 offload_param=Cfg(device='cpu', pin_memory=True) x='a b'")
    ['stage=3', "offload_param=Cfg(device='cpu', pin_memory=True)", "x='a b'"]
    """
    tokens: list[str] = []
    depth = 0
    quote = ""
    start = 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0:
            if i > start:
                tokens.append(text[start:i])
            start = i + 1
    if start < len(text):
        tokens.append(text[start:])
    return tokens


# --------------------------------------------------------------------------------------
# ZeRO configuration from its three sources

ZeroFields = dict[str, int | str | bool | None]

#: (field, deprecated boolean keys that meant "offload to CPU") for the two offloads.
_OFFLOADS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("offload_optimizer", ("cpu_offload",)),
    ("offload_param", ("cpu_offload_param", "cpu_offload_params")),
)


def zero_from_json(zo: Mapping[str, object], *, user: bool) -> ZeroFields:
    """ZeRO fields of a ``zero_optimization`` mapping.

    ``user``: the mapping is the user's config, where an absent key means DeepSpeed's
    default (stage 0, no offload); otherwise (the effective config printed as JSON by
    DeepSpeed < 0.6) an absent key is unknown.

    >>> zero_from_json({"stage": 3, "offload_param": {"device": "cpu"}}, user=True)["offload_param"]
    'cpu'
    """
    out: ZeroFields = {}
    stage = zo.get("stage")
    out["stage"] = _as_int(stage) if stage is not None else (0 if user else None)
    for name, legacy in _OFFLOADS:
        if name in zo:
            value = zo[name]
            # A mapping without "device" is off: the device defaults to "none".
            if isinstance(value, dict):
                out[name] = _device(value.get("device", "none"))
            else:
                out[name] = _device(value)
            continue
        flags = [zo[k] for k in legacy if isinstance(zo.get(k), bool)]
        if flags:
            out[name] = "cpu" if flags[0] else "none"
        else:
            out[name] = "none" if user else None
    out["overlap_comm"] = _as_bool(zo.get("overlap_comm"))
    out["reduce_bucket_size"] = _as_int(zo.get("reduce_bucket_size"))
    out["allgather_bucket_size"] = _as_int(zo.get("allgather_bucket_size"))
    prefetch = zo.get("stage3_prefetch_bucket_size", zo.get("prefetch_bucket_size"))
    out["prefetch_bucket_size"] = _as_int(prefetch)
    return out


def zero_from_user_config(config: Mapping[str, object]) -> ZeroFields:
    """ZeRO fields of the whole user config (``json = {...}``)."""
    zo = config.get("zero_optimization")
    if isinstance(zo, dict):
        return zero_from_json(zo, user=True)
    if isinstance(zo, bool):  # the v0.1 form: "zero_optimization": true meant stage 1
        return {"stage": int(zo), "offload_optimizer": "none", "offload_param": "none"}
    if zo is None:  # no ZeRO section: ZeRO is off
        return {"stage": 0, "offload_optimizer": "none", "offload_param": "none"}
    return {}


def zero_from_repr(text: str) -> ZeroFields:
    """ZeRO fields of the dump's ``zero_config`` value: a pydantic repr (>= v0.6) or JSON.

    >>> f = zero_from_repr("stage=2 reduce_bucket_size=500,000,000 overlap_comm=True "
    ...                    "offload_param=None offload_optimizer=DeepSpeedZeroOffloadOptimizer"
    ...                    "Config(device='cpu', nvme_path=None, pin_memory=True)")
    >>> f["stage"], f["reduce_bucket_size"], f["overlap_comm"], f["offload_param"]
    (2, 500000000, True, 'none')
    >>> f["offload_optimizer"]
    'cpu'
    """
    text = text.strip()
    if text.startswith("{"):
        data = _loads(text)
        return zero_from_json(data, user=False) if isinstance(data, dict) else {}
    kv: dict[str, str] = {}
    for token in _split_top_level(text):
        key, sep, value = token.partition("=")
        if sep and key.isidentifier():
            kv.setdefault(key, value)
    out: ZeroFields = {}
    if "stage" in kv:
        out["stage"] = _as_int(kv["stage"])
    for name, legacy in _OFFLOADS:
        if name in kv:
            value = kv[name]
            if value == "None":
                out[name] = "none"
            else:
                m = _DEVICE_RE.search(value)
                out[name] = _device(m["q"] or m["dq"] or m["enum"] or m["bare"]) if m else None
        else:
            flags = [_as_bool(kv[k]) for k in legacy if _as_bool(kv.get(k)) is not None]
            if flags:
                out[name] = "cpu" if flags[0] else "none"
    if "overlap_comm" in kv:
        out["overlap_comm"] = _as_bool(kv["overlap_comm"])
    for name in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size"):
        if name in kv:
            out[name] = _as_int(kv[name])
    return out if any(v is not None for v in out.values()) else {}


#: Sources of ZeRO facts, best first.
ZERO_SOURCES = ("json", "zero_config", "init_lines", "zero3_lines")


def merge_zero(sources: Mapping[str, ZeroFields]) -> ZeroConfig | None:
    """One :class:`ZeroConfig` from the sources seen, field by field in precedence order."""
    present = [s for s in ZERO_SOURCES if sources.get(s)]
    if not present:
        return None

    def pick(name: str) -> int | str | bool | None:
        for source in present:
            value = sources[source].get(name)
            if value is not None:
                return value
        return None

    def pick_int(name: str) -> int | None:
        value = pick(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def pick_str(name: str) -> str | None:
        value = pick(name)
        return value if isinstance(value, str) else None

    overlap = pick("overlap_comm")
    return ZeroConfig(
        stage=pick_int("stage"),
        offload_optimizer=pick_str("offload_optimizer"),
        offload_param=pick_str("offload_param"),
        overlap_comm=overlap if isinstance(overlap, bool) else None,
        reduce_bucket_size=pick_int("reduce_bucket_size"),
        allgather_bucket_size=pick_int("allgather_bucket_size"),
        prefetch_bucket_size=pick_int("prefetch_bucket_size"),
        source=present[0],
    )


#: ``offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None,
#: buffer_count=4, pin_memory=False, ...)`` in the engine's ``zero_config`` dump.
_OFFLOAD_RE = re.compile(
    r"(?P<what>offload_(?:param|optimizer))=\w+\(device='(?P<device>\w+)'[^)]*?"
    r"pin_memory=(?P<pin>True|False)"
)


@dataclass(frozen=True)
class OffloadSetting:
    """One ZeRO offload as the engine's ``zero_config`` dump prints it."""

    what: str  # offload_param | offload_optimizer
    device: str  # cpu | nvme | none
    pin_memory: bool
    text: str  # as printed


def offload_settings(zero_config: str) -> list[OffloadSetting]:
    """The offloads of a ``zero_config`` dump line.

    >>> offload_settings("stage=3 offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig("
    ...                  "device='cpu', nvme_path=None, buffer_count=4, pin_memory=False)")
    [OffloadSetting(what='offload_optimizer', device='cpu', pin_memory=False, text="offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None, buffer_count=4, pin_memory=False")]
    """  # noqa: E501
    return [
        OffloadSetting(m["what"], m["device"], m["pin"] == "True", m.group(0))
        for m in _OFFLOAD_RE.finditer(zero_config)
    ]


#: One line of an indented JSON object: ``"key": value,`` or ``"key": {`` (``[``).
_JSON_LINE_RE = re.compile(r'^\s*"(?P<key>[^"]*)"\s*:\s*(?P<value>.*?),?\s*$')


def loads_lines(lines: Sequence[str]) -> dict[str, object]:
    """An indented JSON object read line by line, for a dump with a damaged line: each
    ``"key": value`` line on its own, nesting by the braces that are left.  A line that
    is no such line is passed over; its value is lost, the others are kept.

    >>> loads_lines(['{', '  "a": 1,', '  "z": {', '    "stage": 2', '  },', '  "b": true', '}'])
    {'a': 1, 'z': {'stage': 2}, 'b': True}
    >>> loads_lines(['{', '  "a": 1,', '    "stage": 2', '  },', '  "b": 3', '}'])
    {'a': 1, 'stage': 2, 'b': 3}
    """
    root: dict[str, object] = {}
    stack: list[dict[str, object] | None] = [root]  # None: inside a list
    for raw in lines[1:] if lines and lines[0].strip().endswith("{") else lines:
        text = raw.strip()
        if text.startswith(("}", "]")):
            if len(stack) > 1:
                stack.pop()
            continue
        m = _JSON_LINE_RE.match(text)
        if m is None:
            continue
        top = stack[-1]
        value = m["value"]
        if value in ("{", "["):
            child: dict[str, object] | None = {} if value == "{" else None
            if top is not None and child is not None:
                top[m["key"]] = child
            stack.append(child)
            continue
        parsed = _loads(value)
        if top is not None and (parsed is not None or value == "null"):
            top[m["key"]] = parsed  # a value that does not parse is passed over too
    return root

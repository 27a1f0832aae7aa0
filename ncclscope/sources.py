"""Where log text comes from: files, directories, globs, ``.gz`` files and stdin.

Reading lives here and nowhere else; parsers get lines or paths to plain files.
Compressed input and stdin are copied, decompressed, into a work directory so the
scanner can stream them from disk in bounded memory.
"""

from __future__ import annotations

import glob
import os
import shutil
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import polars as pl

from ncclscope.errors import InputError
from ncclscope.evidence.manifest import MANIFEST_NAME, sniff_manifest
from ncclscope.parsers.tools import sniff_tool
from ncclscope.parsers.torch.flight import SNIFF_BYTES, sniff_dump

__all__ = [
    "EVIDENCE_KIND",
    "LOG_KINDS",
    "QUOTE_CHARS",
    "Input",
    "Problem",
    "expand_inputs",
    "read_lines",
    "sniff_binary",
]

#: Input kinds scanned as logs (nccl-tests output holds NCCL's lines too).
LOG_KINDS = ("log", "nccl_tests")
#: An evidence folder's manifest (``evidence.manifest``): read, not scanned.
EVIDENCE_KIND = "evidence_manifest"

_CHUNK = 4 << 20
_GZIP_MAGIC = b"\x1f\x8b"
#: Extensions that are never logs; skipped when walking a directory (named files are read).
_NOT_LOGS = frozenset(
    {
        ".parquet",
        ".png",
        ".jpg",
        ".jpeg",
        ".gif",
        ".svg",
        ".pdf",
        ".pt",
        ".pth",
        ".bin",
        ".safetensors",
        ".npy",
        ".npz",
        ".so",
        ".pyc",
        ".zip",
        ".tar",
        ".whl",
        ".html",
        ".json",
        ".yaml",
        ".yml",
        ".md",
        ".py",
        ".sh",
        ".ipynb",
        ".ckpt",
        ".h5",
        ".arrow",
    }
)


@dataclass(frozen=True)
class Input:
    """One readable text stream to scan.

    Attributes:
        display: the name shown to the user and in JSON (the path as given, or the
            file's path under a directory the user gave; ``-`` for stdin).
        path: the plain-text file to scan (a decompressed copy for ``.gz``/stdin).
        size_bytes: size of ``path``.
        notes: what the user should know about this input (truncated gzip, a last
            line still being written, ...), phrased as messages.
        partial_last_line: the file does not end with a newline.
    """

    display: str
    path: Path
    size_bytes: int
    notes: tuple[str, ...] = field(default=())
    partial_last_line: bool = False
    #: ``path`` is a copy with one empty line put in front (see ``_shield``): line k of
    #: the copy is line k-1 of the input.
    shifted: bool = False
    #: ``log`` (text to scan), or a PyTorch Flight Recorder dump found by its content:
    #: ``flight_pickle`` / ``flight_json`` (read by ``parsers.torch.flight``, not scanned),
    #: or an NCCL tool's output (``parsers.tools.TOOL_KINDS``): ``inspector``,
    #: ``ras_text``, ``ras_json`` (read, not scanned) or ``nccl_tests`` (read and scanned),
    #: or an evidence folder's manifest (``EVIDENCE_KIND``)
    kind: str = "log"


@dataclass(frozen=True)
class Problem:
    """An input the user named that could not be read, with the reason."""

    path: str
    reason: str


def sniff_binary(head: bytes) -> bool:
    """True when the first bytes of a file look like binary data rather than a log.

    A log has no NUL bytes and few control characters; a checkpoint or core file has many.
    """
    if not head:
        return False
    if b"\x00" in head:
        return True
    control = sum(1 for b in head if b < 9 or 13 < b < 32)
    return control / len(head) > 0.05


def expand_inputs(
    names: Sequence[str],
    *,
    workdir: Path,
    stdin: BinaryIO | None = None,
    on_copy: Callable[[str, int], None] | None = None,
) -> tuple[list[Input], list[Problem]]:
    """Turn the command-line names into inputs, in a stable order.

    Args:
        names: files, directories (walked recursively), globs, ``.gz`` files, ``-``.
        workdir: where decompressed copies go; the caller removes it.
        stdin: the binary stream ``-`` reads.
        on_copy: progress callback (display name, bytes copied so far).

    Returns:
        The inputs to scan and the names that could not be read, with reasons.
    """
    inputs: list[Input] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    for name in names:
        try:
            for display, real in _resolve(name):
                key = os.path.realpath(real) if real != "-" else "-"
                if key in seen:
                    continue
                seen.add(key)
                inputs.append(_open_input(display, real, workdir, stdin, on_copy))
        except InputError as err:
            problems.append(Problem(err.path, err.reason))
    return inputs, problems


def _resolve(name: str) -> Iterable[tuple[str, str]]:
    if name == "-":
        yield "-", "-"
        return
    path = Path(name)
    if path.is_dir():
        found = list(_walk(path))
        if not found:
            raise InputError(name, "directory holds no log files")
        yield from ((str(p), str(p)) for p in found)
        return
    if path.exists():
        if not path.is_file():
            raise InputError(name, "not a regular file")
        yield name, name
        return
    if glob.has_magic(name):
        matches = sorted(glob.glob(name, recursive=True))
        files: list[Path] = []
        for match in matches:
            mp = Path(match)
            files.extend(_walk(mp) if mp.is_dir() else [mp] if mp.is_file() else [])
        if not files:
            raise InputError(name, "no file matches this pattern")
        yield from ((str(p), str(p)) for p in files)
        return
    raise InputError(name, "no such file or directory")


def _walk(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fname in sorted(filenames):
            if fname.startswith("."):
                continue
            candidate = Path(dirpath) / fname
            if not candidate.is_file():
                continue
            try:
                with candidate.open("rb") as fh:
                    head = fh.read(SNIFF_BYTES)
            except OSError:
                continue
            # An evidence folder's stacks are read through its manifest, by rank.
            if Path(dirpath).name == "stacks" and (Path(dirpath).parent / MANIFEST_NAME).exists():
                continue
            # Flight Recorder dumps are binary (pickle) or .json: known by content first.
            if sniff_dump(head) is not None or sniff_tool(head) is not None or sniff_manifest(head):
                yield candidate
                continue
            suffixes = candidate.suffixes
            if suffixes and suffixes[-1].lower() in _NOT_LOGS:
                continue
            if candidate.suffix != ".gz" and sniff_binary(head):
                continue
            yield candidate


def _open_input(
    display: str,
    real: str,
    workdir: Path,
    stdin: BinaryIO | None,
    on_copy: Callable[[str, int], None] | None,
) -> Input:
    notes: list[str] = []
    if real == "-":
        if stdin is None:
            raise InputError("-", "standard input is not available")
        target = _fresh(workdir, "stdin")
        # Read the magic ourselves: a pipe cannot seek back and not every stream peeks.
        first = stdin.read(_CHUNK)
        stream = _Prepended(first, stdin)
        if first[:2] == _GZIP_MAGIC:
            notes.extend(_gunzip(stream, target, display, on_copy))
        else:
            _copy(stream, target, display, on_copy)
        return _finish(display, target, notes)
    path = Path(real)
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
    except OSError as err:
        raise InputError(display, f"cannot read: {err.strerror or err}") from None
    if head == _GZIP_MAGIC:
        target = _fresh(workdir, path.name.removesuffix(".gz"))
        with path.open("rb") as raw:
            notes.extend(_gunzip(raw, target, display, on_copy))
        return _shield(_finish(display, target, notes), workdir)
    return _shield(_finish(display, path, notes), workdir)


#: First bytes that make polars' CSV reader decompress a file on its own (zlib, zstd).
_OTHER_MAGIC = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda", b"\x28\xb5\x2f\xfd")


def _shield(inp: Input, workdir: Path) -> Input:
    """A text file that merely starts with compression magic (junk left by a crash) is
    copied behind one empty line, so the reader sees text; line numbers shift by one."""
    if inp.kind not in LOG_KINDS:
        return inp
    with inp.path.open("rb") as fh:
        head = fh.read(4)
    if not any(head.startswith(magic) for magic in _OTHER_MAGIC):
        return inp
    target = _fresh(workdir, inp.path.name)
    with inp.path.open("rb") as src, target.open("wb") as out:
        out.write(b"\n")
        shutil.copyfileobj(src, out, _CHUNK)
    return replace(inp, path=target, shifted=True)


class _Prepended:
    """A read-only stream that yields ``head`` and then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        if self._head:
            out, self._head = self._head, b""
            return out
        return self._rest.read(size)


def _finish(display: str, path: Path, notes: list[str]) -> Input:
    size = path.stat().st_size
    with path.open("rb") as fh:
        kind = sniff_dump(fh.read(SNIFF_BYTES))
    if kind is not None:
        return Input(display, path, size, tuple(notes), kind=kind)
    with path.open("rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if sniff_manifest(head):
        return Input(display, path, size, tuple(notes), kind=EVIDENCE_KIND)
    tool = sniff_tool(head)
    if tool is not None and tool != "nccl_tests":
        return Input(display, path, size, tuple(notes), kind=tool)
    partial = False
    if size:
        with path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            partial = fh.read(1) != b"\n"
        if partial:
            notes.append("the last line has no newline (was the file still being written?)")
    else:
        notes.append("empty file")
    return Input(display, path, size, tuple(notes), partial, kind=tool or "log")


def _fresh(workdir: Path, stem: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    for k in range(1_000_000):
        candidate = workdir / f"{k:05d}-{stem}"
        if not candidate.exists():
            return candidate
    raise InputError(stem, "cannot create a work file")  # pragma: no cover


def _copy(
    src: BinaryIO | _Prepended,
    target: Path,
    display: str,
    on_copy: Callable[[str, int], None] | None,
) -> None:
    done = 0
    with target.open("wb") as out:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            if on_copy:
                on_copy(display, done)


def _gunzip(
    src: BinaryIO | _Prepended,
    target: Path,
    display: str,
    on_copy: Callable[[str, int], None] | None,
) -> list[str]:
    """Decompress a gzip stream (all members) with zlib, keeping every byte before damage.

    ``gzip.GzipFile`` raises on a cut stream and drops what it had decoded in that
    read; feeding zlib ourselves keeps all of it, so no complete line is lost.
    """
    done = 0
    dec = zlib.decompressobj(wbits=31)
    fed = False  # the current member has received input and not yet ended
    problem: str | None = None
    with target.open("wb") as out:
        while problem is None and (chunk := src.read(_CHUNK)):
            while chunk:
                try:
                    data = dec.decompress(chunk)
                except zlib.error as err:
                    problem = f"gzip data is damaged ({err})"
                    break
                fed = True
                out.write(data)
                done += len(data)
                if not dec.eof:
                    break
                # A member ended; another may follow in the unused bytes.
                chunk = dec.unused_data
                dec = zlib.decompressobj(wbits=31)
                fed = False
            if on_copy:
                on_copy(display, done)
        if problem is None and fed:
            problem = "gzip data is truncated"
    if problem:
        return [f"{problem}: kept the {done} bytes decompressed before it"]
    return []


#: Characters of a line kept when it is quoted as evidence.
QUOTE_CHARS = 400


def read_lines(inp: Input, line_nos: Iterable[int]) -> dict[int, str]:
    """The text of lines ``line_nos`` (1-based, as the user's file numbers them) of an
    input, for quoting as evidence; lines that do not exist are left out.

    One streaming pass over the file, however many lines are asked for; it stops after
    the last one.  Long lines are cut to a few hundred characters.
    """
    wanted = sorted(set(line_nos))
    if not wanted:
        return {}
    shift = 1 if inp.shifted else 0
    rows = (
        pl.scan_csv(
            inp.path,
            has_header=False,
            quote_char=None,
            separator="\x1f",
            schema={"line": pl.String},
            extra_columns="ignore",  # a separator byte in the first line: cut, no error
            truncate_ragged_lines=True,
            encoding="utf8-lossy",
            row_index_name="g",
            row_index_offset=1 - shift,
        )
        .head(wanted[-1] + shift)
        .filter(pl.col("g").is_in(pl.Series(wanted, dtype=pl.UInt32).implode()))
        .select("g", pl.col("line").fill_null("").str.slice(0, QUOTE_CHARS))
        .collect(engine="streaming")
    )
    return dict(zip(rows["g"].to_list(), rows["line"].to_list(), strict=True))

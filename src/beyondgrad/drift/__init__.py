"""What changed across JAX versions: the book's behaviours, probed on many JAX releases.

A *probe* (:mod:`beyondgrad.drift.probes`) is a small program checking one behaviour a
chapter teaches. ``python3 dev.py drift`` (maintainers) runs every probe under every
JAX version of ``tools/drift.py``'s list, each in a fresh process, and records the
outcomes in ``results.json`` next to this file (package data, so Colab has it too).
This module reads that file::

    from beyondgrad import drift
    drift.outcome("seed000_split_unused_grad", "0.8.1").exc_class   # 'TypeError'
    drift.first_version("seed001_linearize_transpose_no_cast", "raises")
    print(drift.table(["seed001_linearize_transpose_no_cast"]))

An :class:`Outcome` is ``returns`` (with a short ``value``), ``raises`` (exception
class, first line of the message, innermost JAX frame ``file:line function`` and a
short traceback), ``crash`` (segfault or timeout) or ``unavailable`` (the probe needs a
package, e.g. folx, that does not install with that JAX). Importing this module
imports no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Literal

from beyondgrad.drift.probes import PROBES, ChapterRef, Probe

__all__ = [
    "AS_NEWEST",
    "CHANGED",
    "KINDS",
    "ChapterRef",
    "Outcome",
    "Probe",
    "chapter",
    "environment",
    "first_version",
    "glyph",
    "outcome",
    "printed_as_today",
    "probe",
    "probe_ids",
    "results_path",
    "segments",
    "table",
    "version_key",
    "versions",
]

Kind = Literal["returns", "raises", "crash", "unavailable"]
#: The kinds of outcome a probe can have (the values of ``Kind``), in order.
KINDS: tuple[str, ...] = ("returns", "raises", "crash", "unavailable")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
#: Older ways JAX printed a type inside ``shard_map``: ``ShapedArray(float32[2])``
#: for ``float32[2]``, and ``{data}`` (0.7.x) for the varying axes ``{V:data}``.
_SHAPED = re.compile(r"ShapedArray\(([^()]*)\)")
_BARE_AXES = re.compile(r"\{(?![VUR]:)([A-Za-z_][\w, ]*)\}")


def printed_as_today(text: str) -> str:
    """``text`` with JAX's older prints of a type rewritten the newest way.

    ``ShapedArray(float32[1]{data})`` becomes ``float32[1]{V:data}``: the wrapper
    went in 0.6.1, and 0.7.x printed varying axes without the ``V:``. Two outcomes
    whose values agree after this differ only in how a type was printed.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    previous = None
    while previous != text:
        previous, text = text, _SHAPED.sub(r"\1", text)
    return _BARE_AXES.sub(r"{V:\1}", text)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one probe did on one JAX version."""

    kind: Kind
    value: str = ""  # returns: the short result
    exc_class: str = (
        ""  # raises: e.g. "TypeError", "jax.errors.ConcretizationTypeError"
    )
    message: str = ""  # raises: the message's first line (crash: what happened)
    frame: str = ""  # raises: innermost JAX frame, "jax/_src/core.py:1809 get_aval"
    traceback: str = ""  # raises: the last frames and the exception line (may be empty)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Outcome:
        kind = data.get("kind")
        if kind not in KINDS:
            raise ValueError(f"outcome kind must be one of {KINDS}, got {kind!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in fields})  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def same_behaviour(self, other: Outcome, *, exact: bool = True) -> bool:
        """Same kind, value and exception class; with ``exact`` also message and frame.

        ``exact=False`` is the comparison across versions: messages and line numbers
        move between releases even when the behaviour is the same, and values are
        compared as :func:`printed_as_today` prints them (a type printed the old way
        is the same behaviour).
        """
        if not isinstance(other, Outcome):
            raise TypeError(f"expected an Outcome, got {type(other).__name__}")
        base = (self.kind, self.value, self.exc_class) == (
            other.kind,
            other.value,
            other.exc_class,
        )
        if not exact:
            return (self.kind, printed_as_today(self.value), self.exc_class) == (
                other.kind,
                printed_as_today(other.value),
                other.exc_class,
            )
        norm = lambda s: _HEX.sub("0x…", s)  # noqa: E731
        return (
            base
            and norm(self.message) == norm(other.message)
            and self.frame == other.frame
        )

    def short(self) -> str:
        """One line: the value, or the exception class and message."""
        if self.kind == "returns":
            return f"returns {self.value}"
        if self.kind == "raises":
            return f"raises {self.exc_class}: {self.message}"
        return f"{self.kind}: {self.message}"


def results_path():
    """The committed results file (``beyondgrad/drift/results.json``)."""
    return resources.files("beyondgrad.drift").joinpath("results.json")


@functools.cache
def _data() -> dict:
    path = results_path()
    if not path.is_file():
        return {"versions": {}, "results": {}}
    return json.loads(path.read_text())


def _reload() -> None:
    """Forget the cached file (after the runner rewrote it)."""
    _data.cache_clear()


def version_key(version: str) -> tuple[int, ...]:
    """``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; ``ValueError`` for anything else."""
    if not isinstance(version, str):
        raise TypeError(
            f"a JAX version must be a str like '0.8.2', got {type(version).__name__}"
        )
    if not re.fullmatch(r"\d+(\.\d+){1,3}", version.strip()):
        raise ValueError(
            f"not a JAX release version: {version!r} (expected e.g. '0.8.2')"
        )
    return tuple(int(p) for p in version.strip().split("."))


def _check_probe(probe_id: str) -> str:
    if not isinstance(probe_id, str):
        raise TypeError(f"probe_id must be a str, got {type(probe_id).__name__}")
    if probe_id not in PROBES:
        raise ValueError(
            f"unknown probe id {probe_id!r}; see drift.probe_ids() for the "
            f"{len(PROBES)} known ones"
        )
    return probe_id


def probe_ids() -> list[str]:
    """Every probe id, in the report's order."""
    return list(PROBES)


def probe(probe_id: str) -> Probe:
    """The probe's definition: ``summary``, ``chapter``, ``fast`` and the program ``run``."""
    return PROBES[_check_probe(probe_id)]


def chapter(probe_id: str) -> ChapterRef:
    """The chapter section that teaches the probe's behaviour (``doc`` and ``section``)."""
    return probe(probe_id).chapter


def versions() -> list[str]:
    """The JAX versions with recorded results, oldest first."""
    return sorted(_data()["versions"], key=version_key)


def environment(version: str) -> dict[str, str]:
    """Where a version's row was recorded: jax, jaxlib, python, platform, folx, date."""
    version_key(version)
    env = _data()["versions"].get(version)
    if env is None:
        raise ValueError(
            f"no results recorded for JAX {version}; recorded: {versions()}"
        )
    return dict(env)


def outcome(probe_id: str, version: str) -> Outcome | None:
    """What ``probe_id`` did on JAX ``version`` (``None`` if that cell was not run)."""
    _check_probe(probe_id)
    version_key(version)
    cell = _data()["results"].get(probe_id, {}).get(version)
    return None if cell is None else Outcome.from_dict(cell)


def first_version(probe_id: str, kind: str) -> str | None:
    """The oldest recorded version where ``probe_id``'s outcome has this ``kind``."""
    _check_probe(probe_id)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for v in versions():
        got = outcome(probe_id, v)
        if got is not None and got.kind == kind:
            return v
    return None


#: The glyphs of :func:`table`: the run behaves as on the newest recorded release
#: (what the chapters teach), or differently (the behaviour changed since).
AS_NEWEST, CHANGED = "=", "≠"


def glyph(o: Outcome | None, newest: Outcome | None) -> str:
    """:data:`AS_NEWEST` when ``o`` behaves as ``newest`` (``same_behaviour`` with
    ``exact=False``, or both not run), else :data:`CHANGED`. It says nothing about
    right or wrong: for a probe of a JAX bug, the newest behaviour is the bug."""
    if o is None or newest is None:
        return AS_NEWEST if o is newest else CHANGED
    return AS_NEWEST if o.same_behaviour(newest, exact=False) else CHANGED


def _cell(o: Outcome | None, newest: Outcome | None) -> str:
    mark = glyph(o, newest)
    if o is None:
        return f"{mark} not run"
    if o.kind == "returns":
        short = o.value if len(o.value) <= 40 else o.value[:39] + "…"
        text = f"{mark} returns `{short}`"
    elif o.kind == "raises":
        text = f"{mark} raises `{o.exc_class.rsplit('.', 1)[-1]}`"
    else:
        text = f"{mark} {o.kind}"
    return text.replace("|", "\\|")


def segments(probe_id: str) -> list[tuple[str, str, Outcome | None]]:
    """Runs of consecutive recorded versions with the same behaviour.

    Each run is ``(first, last, outcome)``; two versions are in one run when their
    outcomes have the same kind, value and exception class (``same_behaviour`` with
    ``exact=False``: messages and line numbers move between releases, and a value
    that differs only in how a type is printed is the same), or when
    neither was run. ``outcome`` is the run's newest outcome. Every recorded version
    is in exactly one run, so the runs are the whole row, with the boundaries where
    behaviour changed.
    """
    _check_probe(probe_id)
    runs: list[tuple[str, str, Outcome | None]] = []
    for v in versions():
        o = outcome(probe_id, v)
        if runs:
            first, _, prev = runs[-1]
            same = (prev is None and o is None) or (
                prev is not None
                and o is not None
                and prev.same_behaviour(o, exact=False)
            )
            if same:
                runs[-1] = (first, v, o)
                continue
        runs.append((v, v, o))
    return runs


def _releases(first: str, last: str) -> str:
    return first if first == last else f"{first} – {last}"


def table(probe_ids: Iterable[str] | None = None) -> str:
    """A Markdown table of where behaviour changed: one row per run of versions.

    Columns: probe, releases (first – last recorded version of the run), outcome
    (``=`` as on the newest recorded release, ``≠`` changed since; then what the run
    does, ``returns`` its value or ``raises`` its exception class).
    Rows of one probe follow each other, oldest run first. The table is narrow
    whatever the number of recorded versions (the runs, not the versions, are rows).
    """
    if isinstance(probe_ids, str):
        raise TypeError(
            "probe_ids must be a list of ids, not one str; wrap it: [probe_id]"
        )
    ids = list(PROBES) if probe_ids is None else [_check_probe(p) for p in probe_ids]
    lines = ["| probe | JAX releases | outcome |", "|---|---|---|"]
    for pid in ids:
        runs = segments(pid)
        for i, (first, last, o) in enumerate(runs):
            name = f"`{pid}`" if i == 0 else ""
            cell = _cell(o, runs[-1][2])
            lines.append(f"| {name} | {_releases(first, last)} | {cell} |")
    return "\n".join(lines)

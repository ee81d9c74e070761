"""Exercise checkers: the shared machinery, and one module per chapter.

``beyondgrad.exercises.ch1`` … ``ch5`` hold each chapter's checkers. They are built
from the pieces here:

* :func:`call_answer` runs the student's code. A bare ``raise NotImplementedError``
  (the stub a student starts from) becomes :data:`NOT_ATTEMPTED`; any other exception
  becomes a verdict that keeps the whole (trimmed) message, so JAX's own hints survive,
  after a first line naming the slip where the exception's type tells it (NumPy
  applied to a tracer: :data:`NUMPY_ON_TRACER`; a Python ``if`` on one:
  :data:`PYTHON_BOOL_ON_TRACER`); a value passed where a function is
  expected is named as such.
* :func:`tree_mismatches` compares two pytrees of arrays and says, in words, what
  differs: structure, a Python scalar where an array was expected, shape, dtype,
  non-finite values (which must match the reference exactly, in place and sign), and
  the largest relative error with the dtype of both sides.
* :func:`verdict` turns a list of problems into a :class:`Feedback`.

Policies every checker shares:

* **Time limit.** Each public checker runs whole in a worker thread with one budget
  (:func:`timed_check`, :func:`run_with_time_limit`; :data:`CHECK_LIMIT` seconds unless
  the chapter says otherwise): the student's calls, every case and the reference work.
  After the budget (at most :data:`_MARGIN` s more while the machine is loaded) the
  checker answers with the seconds it waited. A Python-level loop is then stopped (an
  exception raised in the worker thread); compiled code cannot be: a
  ``lax.while_loop`` whose condition never turns false runs on inside XLA, and the
  message says so and asks for a restart (:data:`RESTART_NOTE`). *Interrupt execution*
  while a checker waits does the same. Called in the main thread outside a checker,
  :func:`call_answer` keeps its own :data:`TIME_LIMIT` (:func:`time_limit`).
* **Drawn cases.** :func:`case_rng` draws fresh cases at every check; no seed is
  printed, so a student cannot replay a draw to fit it. A checker's ``seed=`` keyword,
  where it has one, is for tests and for a student who asks for a repeatable run.
* **Return kind.** :func:`tree_mismatches` names a returned function, ``None`` or a
  non-numeric object before comparing shapes (:func:`return_kind_problem`).

A :class:`Feedback` prints as ``✓`` / ``✗`` / ``…`` lines. With ``strict=True`` (what
the book's executed solution cells use) a wrong *or unattempted* answer raises
:class:`ExerciseFailed`, so a broken solution fails the book build; without it the
checker only prints, so a student notebook runs top to bottom with the stubs unfilled.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from beyondgrad import _checks

__all__ = [
    "F32_UNIT_ROUNDOFF",
    "F64_UNIT_ROUNDOFF",
    "NOT_ATTEMPTED",
    "NUMPY_ON_TRACER",
    "PYTHON_BOOL_ON_TRACER",
    "CHECK_LIMIT",
    "TIME_LIMIT",
    "ExerciseFailed",
    "Feedback",
    "call_answer",
    "call_within",
    "case_rng",
    "check_allclose",
    "early_verdict",
    "given_answer",
    "mismatch_verdict",
    "failed",
    "is_stub",
    "require_callable",
    "return_kind_problem",
    "run_with_time_limit",
    "scaled_mismatches",
    "time_limit",
    "timed_check",
    "tree_mismatches",
    "verdict",
]

#: The message every checker prints for an exercise whose stub is still in place.
NOT_ATTEMPTED = "not attempted yet: replace `raise NotImplementedError` with your code"

#: Seconds a student's function may run in one call from a checker (:func:`time_limit`).
TIME_LIMIT = 10.0

#: Seconds one whole check may take (:func:`timed_check`): the student's calls, every
#: case and the reference work, on a loaded 2-core machine; a loop that never ends is
#: answered within this plus a few seconds (:data:`_MARGIN`, :data:`_GRACE`).
CHECK_LIMIT = 30.0

#: Longest exception message kept in feedback (characters, lines).
_MAX_CHARS, _MAX_LINES = 1200, 12


class ExerciseFailed(AssertionError):
    """Raised by a checker called with ``strict=True`` when the answer is not right."""


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The outcome of one check: passed or not (or not attempted), and why, in words."""

    exercise: str
    passed: bool
    messages: tuple[str, ...]
    attempted: bool = True

    def __str__(self) -> str:
        if not self.attempted:  # the stub's line, or the starter's (3.3) with why
            first, *rest = self.messages or (NOT_ATTEMPTED,)
            return "\n".join(
                [f"… {self.exercise}: {first}", *(f"  - {m}" for m in rest)]
            )
        mark = "✓" if self.passed else "✗"
        head = f"{mark} {self.exercise}: " + ("correct" if self.passed else "not yet")
        return "\n".join([head, *(f"  - {m}" for m in self.messages)])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def __bool__(self) -> bool:
        return self.passed


class _Failure:
    """What :func:`call_answer` returns when the student's code could not be evaluated."""

    def __init__(self, message: str, *, stub: bool = False):
        self.message = message
        self.stub = stub


def _trim(text: str) -> str:
    from beyondgrad.raises import readable_paths

    lines = readable_paths(text).strip().splitlines()
    if len(lines) > _MAX_LINES:
        lines = [*lines[:_MAX_LINES], f"... ({len(lines) - _MAX_LINES} more lines)"]
    out = "\n    ".join(lines)
    return out if len(out) <= _MAX_CHARS else out[: _MAX_CHARS - 4] + " ..."


#: Seconds past its limit :func:`time_limit` may wait while the machine is loaded.
_TIME_LIMIT_MARGIN = 3.0

#: The share of the wall time this process's threads, together, must have spent
#: runnable but waiting for a CPU for the machine to count as loaded (:class:`_Load`).
#: Measured on a 2-core machine: one busy thread alone waits about 3 % of the time,
#: beside two busy processes about 68 %; a sleeping or blocked thread waits 0 %.
_LOADED_WAIT_SHARE = 0.2


def _runqueue_waits() -> dict[str, int] | None:
    """Nanoseconds each thread of this process has waited on a run queue (runnable, not
    running), from Linux's ``/proc/self/task/<tid>/schedstat``; None where unreadable
    (another platform, a kernel without scheduler statistics)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    waits: dict[str, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                waits[tid] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return waits or None


class _Load:
    """Whether the machine has been loaded since this object was made: this process's
    threads were runnable but waited for a CPU for at least :data:`_LOADED_WAIT_SHARE`
    of the wall time. A process that merely waits (``time.sleep``, a host callback, a
    blocked read) is not starved, so its time limit is not extended. Where the
    scheduler's statistics cannot be read, the machine never counts as loaded (the
    limits then hold exactly)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.waits = _runqueue_waits()

    def waited(self) -> float:
        """Seconds this process's threads (those still alive) have waited for a CPU
        since the start, summed over the threads (0 where unreadable)."""
        if self.waits is None:
            return 0.0
        now = _runqueue_waits() or {}
        return 1e-9 * sum(w - self.waits.get(tid, 0) for tid, w in now.items())

    def starved(self) -> bool:
        wall = time.monotonic() - self.start
        return wall > 0 and self.waited() >= _LOADED_WAIT_SHARE * wall


#: The :func:`time_limit` blocks running now (main thread), outermost first: each one's
#: limit and the ``time.monotonic()`` at its start.
_LIMITS: list[tuple[float, float]] = []


class _OutOfTime(BaseException):
    """Raised into the student's code by :func:`time_limit`'s timer (a BaseException,
    so that the student's ``except Exception`` does not swallow it)."""


def _out_of_time_message(what: str, seconds: float, waited: float) -> str:
    return (
        f"{what} did not return within {seconds:g} s and was stopped after "
        f"{waited:.1f} s: does a loop never end (a while loop without an iteration "
        "cap, a tolerance it cannot reach)?"
    )


def _watchdog_message(what: str, seconds: float, waited: float) -> str:
    return (
        f"{what} has run for {waited:.0f} s (limit {seconds:g} s) inside compiled code. "
        "If this cell does not finish soon, a loop in it never ends (for example a "
        "lax.while_loop whose condition never becomes false), and nothing can interrupt "
        "compiled code, not even Interrupt execution: restart the runtime (Colab: "
        "Runtime > Restart session; Jupyter: Kernel > Restart), rerun the chapter's "
        "first cells, and make the loop end (bound its iterations)."
    )


@contextlib.contextmanager
def time_limit(
    seconds: float = TIME_LIMIT, *, what: str = "your function"
) -> Iterator[None]:
    """Stop the ``with`` body after ``seconds``: raises ``TimeoutError`` naming ``what``.

    Python code is interrupted by a ``SIGALRM`` timer (main thread only; elsewhere, and
    where the platform has no ``SIGALRM``, the body runs unlimited: the checkers run in
    a worker thread under :func:`run_with_time_limit`, which keeps their time). On a
    loaded machine (its threads waited for a CPU, :class:`_Load`) the limit
    is extended by at most :data:`_TIME_LIMIT_MARGIN` s; the message gives the seconds
    actually waited. Compiled code blocks inside XLA, where no signal is delivered until
    it returns: after the limit a watchdog thread prints :func:`_watchdog_message` to
    stderr instead, once. Inside another ``time_limit`` the outer one governs.
    """
    _checks.number(seconds, "seconds", above=0, where="time_limit: ")
    main = threading.current_thread() is threading.main_thread()
    if not main or not hasattr(signal, "setitimer"):
        yield
        return
    if _LIMITS:  # an enclosing limit governs
        yield
        return

    load = _Load()
    wall0 = load.start
    last = seconds + _TIME_LIMIT_MARGIN

    def starved() -> bool:
        """Whether the machine is loaded (:class:`_Load`) and the margin is not spent:
        then the limit is extended."""
        return time.monotonic() - wall0 < last and load.starved()

    def on_alarm(signum: int, frame: Any) -> None:
        if starved():
            left = last - (time.monotonic() - wall0)
            signal.setitimer(signal.ITIMER_REAL, max(0.05, min(seconds / 4, left)))
            return
        raise _OutOfTime

    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        while not done.wait(0.25):
            waited = time.monotonic() - wall0
            if waited >= last or (waited >= seconds + 1.0 and not starved()):
                print(
                    _watchdog_message(what, seconds, waited),
                    file=sys.stderr,
                    flush=True,
                )
                return

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    threading.Thread(target=watch, daemon=True).start()
    _LIMITS.append((seconds, wall0))
    try:
        yield
    except _OutOfTime:
        waited = time.monotonic() - wall0
        raise TimeoutError(_out_of_time_message(what, seconds, waited)) from None
    finally:
        _LIMITS.pop()
        done.set()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def case_rng(seed: int | None = None) -> np.random.Generator:
    """The random generator a checker draws its cases from: fresh entropy at every
    check (``seed=None``), so no printed seed lets a student replay a draw; a given
    ``seed`` (tests, or a student who asks for a repeatable run) reproduces it."""
    return np.random.default_rng(_checks.seed(seed, where="case_rng: "))


def require_callable(fn: Any, what: str = "your function") -> str | None:
    """A message if ``fn`` is not callable ("you passed a value; pass the function")."""
    if callable(fn):
        return None
    kind = type(fn).__name__
    shape = getattr(fn, "shape", None)
    desc = f"{kind} of shape {tuple(shape)}" if shape is not None else kind
    return (
        f"{what} should be a function, but you passed a value ({desc}); "
        "pass the function itself, without calling it"
    )


def call_answer(fn: Any, *args: Any, what: str = "your function", **kwargs: Any) -> Any:
    """Call the student's ``fn``; on failure return a :class:`_Failure` describing it."""
    msg = require_callable(fn, what)
    if msg:
        return _Failure(msg)
    try:
        with time_limit(TIME_LIMIT, what=what):
            return fn(*args, **kwargs)
    except _OutOfTime:  # an enclosing time_limit's timer fired in the student's code
        limit, start = _LIMITS[0] if _LIMITS else (0.0, time.monotonic())
        return _Failure(_out_of_time_message(what, limit, time.monotonic() - start))
    except TimeoutError as e:
        if "did not return within" in str(e):
            return _Failure(str(e))
        return _Failure(f"{what} raised TimeoutError: {_trim(str(e))}")
    except NotImplementedError as e:
        if not str(e):  # the bare `raise NotImplementedError` of the exercise stub
            return _Failure(NOT_ATTEMPTED, stub=True)
        return _Failure(f"{what} raised NotImplementedError: {_trim(str(e))}")
    except Exception as e:  # the student's error is the feedback
        text = _trim(str(e))
        raised = f"{what} raised {type(e).__name__}" + (
            f": {text}" if text else " (no message)"
        )
        slip = _named_slip(e)
        return _Failure(f"{slip}\n    {raised}" if slip else raised)


#: The first line of a failure whose exception is JAX's
#: ``TracerArrayConversionError`` (:func:`_named_slip`).
NUMPY_ON_TRACER = (
    "your code turned a traced value into a NumPy array (a numpy function such as "
    "np.exp, np.where or np.asarray applied to its input, or to a value computed from "
    "it): under jit, vmap, grad and shard_map the input is a tracer, which has no "
    "NumPy value; write it with jax.numpy (jnp.exp, jnp.where, ...), JAX's error below"
)


#: The first line of a failure whose exception is JAX's
#: ``TracerBoolConversionError`` (:func:`_named_slip`).
PYTHON_BOOL_ON_TRACER = (
    "your code asked Python for the truth of a traced value (an if, while, and, or, "
    "not or assert on the input or a value computed from it): under jit, vmap, grad "
    "and shard_map the input is a tracer, which has no True or False; choose with "
    "jnp.where or lax.cond, loop with lax.while_loop, JAX's error below"
)


def _named_slip(error: Exception) -> str | None:
    """The student's slip in plain words, for an exception whose cause is known from
    its type alone (the checker's :func:`call_answer` puts it before JAX's text); None
    otherwise. Today: NumPy applied to a tracer (:data:`NUMPY_ON_TRACER`) and a
    Python truth test of a tracer (:data:`PYTHON_BOOL_ON_TRACER`)."""
    if isinstance(error, jax.errors.TracerArrayConversionError):
        return NUMPY_ON_TRACER
    if isinstance(error, jax.errors.TracerBoolConversionError):
        return PYTHON_BOOL_ON_TRACER
    return None


def call_within(
    seconds: float, fn: Any, *args: Any, what: str = "your function", **kwargs: Any
) -> Any:
    """:func:`call_answer` under :func:`run_with_time_limit`: a failure message naming
    ``what`` after ``seconds``."""
    return run_with_time_limit(
        lambda: call_answer(fn, *args, what=what, **kwargs), seconds, what=what
    )


def failed(value: Any) -> str | None:
    """The failure message if ``value`` came from a failed :func:`call_answer`, else None."""
    return value.message if isinstance(value, _Failure) else None


def is_stub(value: Any) -> bool:
    """True if ``value`` is :func:`call_answer`'s verdict on an unfilled stub."""
    return isinstance(value, _Failure) and value.stub


def _describe_leaf(x: Any) -> str:
    if isinstance(x, (bool, int, float, complex)):
        return f"a Python {type(x).__name__}"
    arr = np.asarray(x)
    return f"{arr.dtype}{list(arr.shape)}"


def _nonfinite_mismatch(
    a: np.ndarray, r: np.ndarray
) -> tuple[int, tuple[int, ...]] | None:
    """(count, first index) of places where non-finite values differ, or None."""
    a_nan, r_nan = np.isnan(a), np.isnan(r)
    a_inf, r_inf = np.isinf(a), np.isinf(r)
    bad = (
        (a_nan != r_nan)
        | (a_inf != r_inf)
        | (a_inf & r_inf & (np.sign(a) != np.sign(r)))
    )
    if not np.any(bad):
        return None
    first = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    return int(np.count_nonzero(bad)), tuple(int(k) for k in first)


def tree_mismatches(
    answer: Any,
    reference: Any,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    name: str = "answer",
    allow_python_scalars: bool = True,
) -> list[str]:
    """Differences between two pytrees of arrays, as plain-words messages (empty if equal).

    Checks, in order: tree structure; for each leaf, a Python scalar where the
    reference is an array (when ``allow_python_scalars`` is false), the shape, whether
    it is floating/complex vs integer/bool; then non-finite values, which must match the
    reference exactly (NaN where NaN, ``+inf`` where ``+inf``, ``-inf`` where ``-inf``);
    then the finite values, ``|a - r| <= atol + rtol |r|``. A value mismatch reports the
    worst entry, its relative error and both dtypes.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    kind = return_kind_problem(answer, reference, name=name)
    if kind:
        return [kind]
    a_leaves, a_def = jax.tree_util.tree_flatten(answer)
    r_leaves, r_def = jax.tree_util.tree_flatten(reference)
    if a_def != r_def:
        return [f"{name} has structure {a_def}, expected {r_def}"]
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(reference)[0]
    ]
    problems: list[str] = []
    for path, a, r in zip(paths, a_leaves, r_leaves):
        where = f"{name}{path}"
        a_np, r_np = np.asarray(a), np.asarray(r)
        scalar = isinstance(a, (bool, int, float, complex))
        if (
            scalar
            and not allow_python_scalars
            and not isinstance(r, (bool, int, float, complex))
        ):
            problems.append(
                f"{where} is {_describe_leaf(a)}, expected an array ({_describe_leaf(r)}): "
                "return the JAX array itself (no float()/int()/.item())"
            )
            continue
        if a_np.shape != r_np.shape:
            problems.append(f"{where} has shape {a_np.shape}, expected {r_np.shape}")
            continue
        a_inexact = np.issubdtype(a_np.dtype, np.inexact)
        r_inexact = np.issubdtype(r_np.dtype, np.inexact)
        if a_inexact != r_inexact:
            kind = "a floating" if r_inexact else "an integer/bool"
            problems.append(
                f"{where} has dtype {a_np.dtype}, expected {kind} dtype like {r_np.dtype}"
            )
            continue
        if not a_inexact:
            if not np.array_equal(a_np, r_np):
                i: tuple[Any, ...] = (
                    np.unravel_index(int(np.argmax(a_np != r_np)), a_np.shape)
                    if a_np.ndim
                    else ()
                )
                idx = f" at index {tuple(int(k) for k in i)}" if a_np.ndim else ""
                problems.append(
                    f"{where} differs{idx}: got {a_np[i]}, expected {r_np[i]}"
                )
            continue
        nonfinite = _nonfinite_mismatch(a_np, r_np)
        if nonfinite is not None:
            count, i = nonfinite
            idx = f" at index {i}" if a_np.ndim else ""
            problems.append(
                f"{where} has {count} entr{'y' if count == 1 else 'ies'} whose nan/inf does not match "
                f"the reference (first{idx}: got {a_np[i]}, expected {r_np[i]})"
            )
            continue
        finite = np.isfinite(r_np)
        cplx = np.iscomplexobj(a_np) or np.iscomplexobj(r_np)
        a64 = np.where(finite, a_np, 0).astype(np.complex128 if cplx else np.float64)
        r64 = np.where(finite, r_np, 0).astype(np.complex128 if cplx else np.float64)
        err = np.abs(a64 - r64)
        tol = atol + rtol * np.abs(r64)
        if np.any(err > tol):
            i = (
                np.unravel_index(int(np.argmax(err - tol)), err.shape)
                if err.ndim
                else ()
            )
            idx = f" at index {tuple(int(k) for k in i)}" if err.ndim else ""
            scale = float(np.abs(r64[i]))
            rel = float(err[i]) / scale if scale > 0 else float("inf")
            problems.append(
                f"{where} differs from the reference{idx}: got {a64[i]:.9g} ({a_np.dtype}), "
                f"expected {r64[i]:.9g} ({r_np.dtype}); relative error {rel:.2e}, "
                f"allowed {atol:g} + {rtol:g}*|expected|"
            )
    return problems


#: The unit roundoff of float64, 2**-53: a correctly rounded operation errs by at most
#: this much relative to its exact result. Tolerances that follow from an error count
#: (``k`` roundings, each of at most ``F64_UNIT_ROUNDOFF`` of the magnitude it acts
#: on) are written as multiples of it.
F64_UNIT_ROUNDOFF = 2.0**-53
#: The unit roundoff of float32 (the same use, for float32 checks).
F32_UNIT_ROUNDOFF = 2.0**-24


def scaled_mismatches(
    answer: Any,
    reference: Any,
    scale: Any,
    *,
    tol: float,
    name: str = "answer",
    scale_name: str = "the sum of the magnitudes of its terms",
    allow_python_scalars: bool = True,
) -> list[str]:
    """Differences between ``answer`` and ``reference`` measured against ``scale``.

    The test is ``|a - r| <= tol * scale`` entrywise, with ``scale`` (an array of
    ``reference``'s shape, or a scalar) the magnitude a rounding error is made on, e.g.
    ``sum_k |t_k|`` for ``r = sum_k t_k``: when the terms cancel, the rounding error of
    a correct answer follows the terms, not the result. Kind, structure, shape, dtype
    kind and non-finite values are checked first, as in :func:`tree_mismatches`.

    Returns:
        Messages (empty if the answer is within the tolerance).

    Raises:
        ValueError: ``tol`` negative, or ``scale`` negative or not finite.
    """
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    problems = tree_mismatches(
        answer,
        reference,
        rtol=0.0,
        atol=np.inf,
        name=name,
        allow_python_scalars=allow_python_scalars,
    )
    if problems:
        return problems
    s = np.broadcast_to(np.asarray(scale, np.float64), np.shape(reference))
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("scale must be finite and >= 0 (the checker's own error)")
    r = np.asarray(reference)
    finite = np.isfinite(r)
    a64 = np.where(finite, np.asarray(answer), 0).astype(np.float64)
    r64 = np.where(finite, r, 0).astype(np.float64)
    err = np.abs(a64 - r64)
    allowed = tol * s
    if not np.any(err > allowed):
        return []
    i: tuple[Any, ...] = (
        np.unravel_index(int(np.argmax(err - allowed)), err.shape) if err.ndim else ()
    )
    idx = f" at index {tuple(int(k) for k in i)}" if err.ndim else ""
    return [
        f"{name} differs from the reference{idx}: got {a64[i]:.9g} "
        f"({np.asarray(answer).dtype}), expected {r64[i]:.9g} ({r.dtype}); error "
        f"{err[i]:.2e}, allowed {tol:.2g} x {s[i]:.3g} ({scale_name})"
    ]


def _kind_of(x: Any) -> str | None:
    """What a returned value is, when it is not something numeric to compare."""
    if x is None:
        return "None (does your function end without `return`?)"
    if isinstance(
        x, jax.Array | np.ndarray | np.generic | bool | int | float | complex
    ):
        return None
    if callable(x):
        name = getattr(x, "__name__", type(x).__name__)
        return (
            f"a function ({name}), not its value: call it, or return what it computes"
        )
    if isinstance(x, str | bytes):
        return f"a {type(x).__name__} ({str(x)[:40]!r}), not a number or array"
    return None


def return_kind_problem(
    answer: Any, reference: Any, *, name: str = "answer"
) -> str | None:
    """A message when ``answer`` (or a leaf of it) is of the wrong kind altogether: a
    function, ``None`` or a string where ``reference`` holds numbers; else None."""
    kind = _kind_of(answer)
    if kind and _kind_of(reference) is None:
        return f"{name} is {kind}"
    expected = jax.tree_util.tree_leaves(reference, is_leaf=lambda x: x is None)
    none_expected = any(x is None for x in expected)
    for leaf in jax.tree_util.tree_leaves(answer, is_leaf=lambda x: x is None):
        kind = _kind_of(leaf)
        if kind and not (leaf is None and none_expected):
            return f"{name} contains {kind}"
    return None


def verdict(
    exercise: str,
    problems: Sequence[str],
    *,
    success: str = "",
    strict: bool = False,
    attempted: bool = True,
) -> Feedback:
    """A :class:`Feedback` that passes when ``problems`` is empty (and it was attempted)."""
    if not attempted:
        fb = Feedback(exercise, False, (NOT_ATTEMPTED,), attempted=False)
    else:
        passed = not problems
        messages = tuple(problems) if problems else ((success,) if success else ())
        fb = Feedback(exercise, passed, messages)
    if strict and not fb.passed:
        raise ExerciseFailed(str(fb))
    return fb


def early_verdict(
    exercise: str, value: Any, *, strict: bool = False
) -> Feedback | None:
    """The verdict for a stub (not attempted) or a failed :func:`call_answer`, else None.

    The first step of most checkers: ``fb = early_verdict(name, got, strict=strict)``,
    then ``if fb is not None: return fb`` (a failing :class:`Feedback` is falsy).
    """
    if is_stub(value):
        return verdict(exercise, [], attempted=False, strict=strict)
    msg = failed(value)
    if msg:
        return verdict(exercise, [msg], strict=strict)
    return None


def given_answer(
    exercise: str, answer: Any, *, what: str, strict: bool = False
) -> tuple[Any, Feedback | None]:
    """An answer given as a value or as a function returning it: ``(value, early)``.

    A callable is called with no arguments (through :func:`call_answer`, named ``what``);
    ``early`` is :func:`early_verdict` of the value (None when it is there to grade).
    """
    if callable(answer):
        answer = call_answer(answer, what=what)
    return answer, early_verdict(exercise, answer, strict=strict)


def mismatch_verdict(
    exercise: str,
    answer: Any,
    reference: Any,
    *,
    name: str,
    allow_python_scalars: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    strict: bool = False,
) -> Feedback | None:
    """The failing verdict for a stub, a failure or a mismatch with ``reference``, else None.

    For a step that must pass before a checker goes on: :func:`early_verdict`, then
    :func:`tree_mismatches` with the same ``name``, tolerances and scalar rule.
    """
    early = early_verdict(exercise, answer, strict=strict)
    if early is not None:
        return early
    problems = tree_mismatches(
        answer,
        reference,
        rtol=rtol,
        atol=atol,
        name=name,
        allow_python_scalars=allow_python_scalars,
    )
    return verdict(exercise, problems, strict=strict) if problems else None


def check_allclose(
    exercise: str,
    answer: Any,
    reference: Any,
    *,
    success: str = "matches the reference",
    rtol: float = 1e-5,
    atol: float = 1e-6,
    strict: bool = False,
) -> Feedback:
    """Check a value (or the :class:`_Failure` of computing it) against a reference pytree."""
    early = early_verdict(exercise, answer, strict=strict)
    if early is not None:
        return early
    problems = tree_mismatches(answer, reference, rtol=rtol, atol=atol)
    return verdict(exercise, problems, success=success, strict=strict)


#: A checker's signature: the student's answer in, :class:`Feedback` out.
Checker = Callable[..., Feedback]


class _TimeLimit(BaseException):
    """Raised inside a checker's worker thread once its time is up."""


#: Seconds past its limit a check may wait while the machine is loaded (the process's
#: threads waited for a CPU, :class:`_Load`), plus the second :func:`_stop` waits for
#: the worker to end: a check answers within its limit + 4 s (a student is promised
#: the limit + 5 s).
_MARGIN = 3.0
_GRACE = 1.0

#: A note printed after a check stopped waiting while the answer still runs.
RESTART_NOTE = (
    "the answer is still running in the background (a loop inside compiled code, such "
    "as a lax.while_loop, cannot be interrupted, not even by Interrupt execution): "
    "restart the kernel (Colab: Runtime > Restart session; Jupyter: Kernel > Restart) "
    "to stop it, run the cells above again, then make the loop end"
)


def _timeout_message(
    what: str, seconds: float, waited: float, *, stopped: bool, busy: float = 0.0
) -> str:
    """What :func:`run_with_time_limit` says after ``waited`` s: the limit, the seconds
    waited, and whether the answer was stopped or still runs (:data:`RESTART_NOTE`);
    ``busy`` (s the check's threads waited for a CPU, from :class:`_Load`) adds a
    note when the machine was loaded: a right answer may then need a rerun."""
    head = (
        f"{what} did not finish within {seconds:g} s (stopped waiting after "
        f"{waited:.1f} s); is there a loop whose condition never turns false?"
    )
    tail = (
        "It was stopped."
        if stopped
        else f"{RESTART_NOTE[0].upper()}{RESTART_NOTE[1:]}."
    )
    if busy >= _LOADED_WAIT_SHARE * waited > 0:
        tail += (
            f" The machine was busy (the check waited {busy:.0f} s for a CPU): if "
            "your code has no endless loop, run the check again."
        )
    return f"{head} {tail}"


def _stop(worker: threading.Thread, finished: threading.Event) -> bool:
    """Raise :class:`_TimeLimit` in ``worker`` and wait up to :data:`_GRACE` s for it to
    end (``finished`` is set when it has); True if it ended. A loop in Python code stops
    at its next bytecode (the thread runs only the check, whose ``with`` blocks unwind
    as for any exception); compiled code (XLA) sees the exception only when it returns,
    which an endless loop never does. ``finished``, not ``worker.is_alive()``, says
    whether it ended: a ``join`` interrupted by Interrupt execution (KeyboardInterrupt)
    leaves CPython (3.11, 3.12) reporting a running thread as not alive.
    """
    for _ in range(2):  # again, in case the first landed in a handler the answer owns
        if finished.is_set():
            return True
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(worker.ident or 0), ctypes.py_object(_TimeLimit)
        )
        finished.wait(_GRACE / 2)
    return finished.is_set()


def run_with_time_limit(
    task: Callable[[], Any], seconds: float, *, what: str = "your code"
) -> Any:
    """``task()``, or a failure (see :func:`failed`) if it takes more than ``seconds``.

    The task runs in a daemon thread and the caller waits for it at most ``seconds``,
    extended by up to :data:`_MARGIN` s while the process's threads wait for a CPU (a
    loaded machine, :class:`_Load`; not while the answer sleeps or blocks), so a
    student's endless loop cannot hold the checker. Then the thread is stopped (:func:`_stop`): a Python loop ends there; a compiled loop runs
    on, and the failure message says so and asks for a restart (:data:`RESTART_NOTE`).
    The message gives the seconds actually waited. *Interrupt execution* while waiting
    stops the thread the same way and prints :data:`RESTART_NOTE` if it still runs.
    An exception raised by ``task`` is raised here. Run a whole check as one task (one
    budget per check; some of JAX's caches are per thread). The caller's
    ``jax_enable_x64`` setting (which JAX keeps per thread) holds inside the task too.

    Args:
        task: the work, called with no arguments.
        seconds: how long to wait for it (> 0).
        what: the name of the code in the message ("your solver").

    Returns:
        ``task()``'s value, or a failure that :func:`failed` turns into its message.

    Raises:
        TypeError, ValueError: ``seconds`` is not a number > 0.
    """
    _checks.number(seconds, "seconds", above=0, where="run_with_time_limit: ")
    x64 = bool(jax.config.jax_enable_x64)
    box: dict[str, Any] = {}

    finished = threading.Event()

    def work() -> None:
        try:
            try:
                with jax.enable_x64(x64):
                    box["value"] = task()
            except _TimeLimit:  # the caller has stopped waiting
                pass
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
        finally:
            while not finished.is_set():
                with contextlib.suppress(_TimeLimit):  # a second stop, landing late
                    finished.set()

    load = _Load()
    wall0 = load.start
    worker = threading.Thread(target=work, daemon=True, name="beyondgrad-check")
    worker.start()
    try:
        # an Event, not worker.join: Interrupt during a join corrupts is_alive()
        finished.wait(seconds)
        while not finished.is_set():
            waited = time.monotonic() - wall0
            if waited >= seconds + _MARGIN or not load.starved():
                break
            finished.wait(min(0.25, seconds + _MARGIN - waited))
    except BaseException:  # Interrupt execution (KeyboardInterrupt) while waiting
        if not _stop(worker, finished):
            print(f"{what}: {RESTART_NOTE}.", file=sys.stderr, flush=True)
        raise
    if not finished.is_set():
        waited = time.monotonic() - wall0
        busy = load.waited()  # before the stop: the worker's own wait counts
        stopped = _stop(worker, finished)
        return _Failure(
            _timeout_message(what, seconds, waited, stopped=stopped, busy=busy)
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


def timed_check(
    exercise: str, seconds: float = 30.0
) -> Callable[[Callable[..., Feedback]], Callable[..., Feedback]]:
    """A decorator: the whole checker runs under :func:`run_with_time_limit` with one
    budget of ``seconds`` (the student's calls, the reference work, every case).

    Past the budget the checker returns (or, called with ``strict=True``, raises) a
    failed :class:`Feedback` for ``exercise`` naming the limit and the seconds waited.

    Args:
        exercise: the exercise's name in the feedback ("Exercise 5.1").
        seconds: the check's budget (> 0).

    Returns:
        The decorator.
    """
    _checks.number(seconds, "seconds", above=0, where="timed_check: ")

    def wrap(check: Callable[..., Feedback]) -> Callable[..., Feedback]:
        signature = inspect.signature(check)

        @functools.wraps(check)
        def run(*args: Any, **kwargs: Any) -> Feedback:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            strict = bool(bound.arguments.get("strict", False))
            result = run_with_time_limit(
                lambda: check(*args, **kwargs), seconds, what="your answer"
            )
            if isinstance(result, _Failure):
                return verdict(exercise, [result.message], strict=strict)
            return result

        run.time_limit = seconds  # type: ignore[attr-defined]
        return run

    return wrap

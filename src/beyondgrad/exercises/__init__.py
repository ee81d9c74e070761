"""Exercise checkers: the shared machinery, and one module per chapter.

``beyondgrad.exercises.ch1`` … ``ch5`` hold each chapter's checkers. They are built
from the pieces here:

* :func:`call_answer` runs the student's code. A bare ``raise NotImplementedError``
  (the stub a student starts from) becomes :data:`NOT_ATTEMPTED`; any other exception
  becomes a verdict that keeps the whole (trimmed) message, so JAX's own hints survive;
  a value passed where a function is expected is named as such.
* :func:`tree_mismatches` compares two pytrees of arrays and says, in words, what
  differs: structure, a Python scalar where an array was expected, shape, dtype,
  non-finite values (which must match the reference exactly, in place and sign), and
  the largest relative error with the dtype of both sides.
* :func:`verdict` turns a list of problems into a :class:`Feedback`.

A :class:`Feedback` prints as ``✓`` / ``✗`` / ``…`` lines. With ``strict=True`` (what
the book's executed solution cells use) a wrong *or unattempted* answer raises
:class:`ExerciseFailed`, so a broken solution fails the book build; without it the
checker only prints, so a student notebook runs top to bottom with the stubs unfilled.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

__all__ = [
    "NOT_ATTEMPTED",
    "ExerciseFailed",
    "Feedback",
    "call_answer",
    "call_within",
    "check_allclose",
    "early_verdict",
    "given_answer",
    "mismatch_verdict",
    "failed",
    "is_stub",
    "require_callable",
    "tree_mismatches",
    "verdict",
]

#: The message every checker prints for an exercise whose stub is still in place.
NOT_ATTEMPTED = "not attempted yet: replace `raise NotImplementedError` with your code"

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
        if not self.attempted:
            return f"… {self.exercise}: {NOT_ATTEMPTED}"
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
    lines = text.strip().splitlines()
    if len(lines) > _MAX_LINES:
        lines = [*lines[:_MAX_LINES], f"... ({len(lines) - _MAX_LINES} more lines)"]
    out = "\n    ".join(lines)
    return out if len(out) <= _MAX_CHARS else out[: _MAX_CHARS - 4] + " ..."


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
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if not str(e):  # the bare `raise NotImplementedError` of the exercise stub
            return _Failure(NOT_ATTEMPTED, stub=True)
        return _Failure(f"{what} raised NotImplementedError: {_trim(str(e))}")
    except Exception as e:  # the student's error is the feedback
        text = _trim(str(e))
        return _Failure(
            f"{what} raised {type(e).__name__}"
            + (f": {text}" if text else " (no message)")
        )


def call_within(
    seconds: float, fn: Any, *args: Any, what: str = "your function", **kwargs: Any
) -> Any:
    """:func:`call_answer` with a time limit: a failure message after ``seconds``.

    The call runs in a daemon thread, under the caller's ``jax_enable_x64`` setting
    (JAX keeps that setting per thread). A compiled loop cannot be interrupted, so
    after the limit the call goes on in the background; the message says so, and that
    restarting the kernel stops it.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(seconds).__name__}")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    x64 = bool(jax.config.jax_enable_x64)
    result: list[Any] = []

    def run() -> None:
        with jax.enable_x64(x64):
            result.append(call_answer(fn, *args, what=what, **kwargs))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() or not result:
        return _Failure(
            f"{what} did not return within {seconds:g} s: it probably never stops (a "
            "while_loop whose condition stays true, e.g. a tolerance it cannot reach "
            "and no iteration cap). It is still running in the background: restart "
            "the kernel to stop it, then cap your loop (k < max_iter)"
        )
    return result[0]


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

"""Exercise checkers: compare a student's answer with a reference and say why it is wrong.

Every chapter's checkers are built from these pieces:

* :func:`call_answer` runs the student's code and turns ``NotImplementedError``
  (the ``...`` stub) or any other exception into a plain-words verdict;
* :func:`tree_mismatches` compares two pytrees of arrays (structure, shape, dtype
  kind, values within ``rtol``/``atol``) and lists what differs;
* :func:`verdict` turns a list of problems into a :class:`Feedback`.

A checker returns a :class:`Feedback` that prints as ``✓``/``✗`` lines. With
``strict=True`` (what the book's executed solution cells use) a failing check raises
:class:`ExerciseFailed`, so a broken solution fails the book build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


class ExerciseFailed(AssertionError):
    """Raised by a checker called with ``strict=True`` when the answer is wrong."""


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The outcome of one check: passed or not, and why, in plain words."""

    exercise: str
    passed: bool
    messages: tuple[str, ...]

    def __str__(self) -> str:
        mark = "✓" if self.passed else "✗"
        head = f"{mark} {self.exercise}: " + ("correct" if self.passed else "not yet")
        return "\n".join([head, *(f"  - {m}" for m in self.messages)])

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def __bool__(self) -> bool:
        return self.passed


def verdict(exercise: str, problems: Sequence[str], *, success: str = "", strict: bool = False) -> Feedback:
    """A :class:`Feedback` that passes when ``problems`` is empty."""
    passed = not problems
    messages = tuple(problems) if problems else ((success,) if success else ())
    fb = Feedback(exercise, passed, messages)
    if strict and not passed:
        raise ExerciseFailed(str(fb))
    return fb


class _Failure:
    """Sentinel carrying the plain-words reason an answer could not be evaluated."""

    def __init__(self, message: str):
        self.message = message


def call_answer(fn: Any, *args: Any, what: str = "your function", **kwargs: Any) -> Any:
    """Call the student's ``fn``; on failure return a :class:`_Failure` describing it."""
    if not callable(fn):
        return _Failure(f"{what} must be a function, got {type(fn).__name__}")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if not str(e):  # the bare `raise NotImplementedError` of the exercise stub
            return _Failure(f"{what} is still the stub: replace `raise NotImplementedError` with your code")
        return _Failure(f"{what} raised NotImplementedError: {str(e).splitlines()[0]}")
    except Exception as e:  # the student's error is the feedback
        return _Failure(f"{what} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))


def failed(value: Any) -> str | None:
    """The failure message if ``value`` came from a failed :func:`call_answer`, else None."""
    return value.message if isinstance(value, _Failure) else None


def tree_mismatches(
    answer: Any, reference: Any, *, rtol: float = 1e-5, atol: float = 1e-6, name: str = "answer"
) -> list[str]:
    """Differences between two pytrees of arrays, as plain-words messages (empty if equal).

    Checks, in order: tree structure, then for each leaf its shape, whether it is
    floating/complex vs integer/bool, finiteness, and ``|a - r| <= atol + rtol |r|``.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    a_leaves, a_def = jax.tree_util.tree_flatten(answer)
    r_leaves, r_def = jax.tree_util.tree_flatten(reference)
    if a_def != r_def:
        return [f"{name} has structure {a_def}, expected {r_def}"]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(reference)[0]]
    problems: list[str] = []
    for path, a, r in zip(paths, a_leaves, r_leaves):
        where = f"{name}{path}"
        a_np, r_np = np.asarray(a), np.asarray(r)
        if a_np.shape != r_np.shape:
            problems.append(f"{where} has shape {a_np.shape}, expected {r_np.shape}")
            continue
        a_inexact = np.issubdtype(a_np.dtype, np.inexact)
        r_inexact = np.issubdtype(r_np.dtype, np.inexact)
        if a_inexact != r_inexact:
            problems.append(f"{where} has dtype {a_np.dtype}, expected a {'floating' if r_inexact else 'integer/bool'} dtype like {r_np.dtype}")
            continue
        if a_inexact and not np.all(np.isfinite(a_np)) and np.all(np.isfinite(r_np)):
            bad = int(np.size(a_np) - np.count_nonzero(np.isfinite(a_np)))
            problems.append(f"{where} has {bad} non-finite value(s) (nan/inf); the reference is finite")
            continue
        a64 = a_np.astype(np.complex128 if np.iscomplexobj(a_np) else np.float64)
        r64 = r_np.astype(np.complex128 if np.iscomplexobj(r_np) else np.float64)
        err = np.abs(a64 - r64)
        tol = atol + rtol * np.abs(r64)
        if np.any(err > tol):
            i = np.unravel_index(int(np.argmax(err - tol)), err.shape) if err.ndim else ()
            idx = f" at index {tuple(int(k) for k in i)}" if err.ndim else ""
            problems.append(
                f"{where} differs from the reference{idx}: got {a64[i]:.6g}, expected {r64[i]:.6g} "
                f"(max abs error {float(err.max()):.3g}, allowed {atol:g} + {rtol:g}*|expected|)"
            )
    return problems


def check_allclose(
    exercise: str,
    answer: Any,
    reference: Any,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    success: str = "matches the reference",
    strict: bool = False,
) -> Feedback:
    """Check a value (or the :class:`_Failure` of computing it) against a reference pytree."""
    msg = failed(answer)
    problems = [msg] if msg else tree_mismatches(answer, reference, rtol=rtol, atol=atol)
    return verdict(exercise, problems, success=success, strict=strict)


def check_function(
    exercise: str,
    fn: Callable[..., Any],
    reference_fn: Callable[..., Any],
    inputs: Sequence[tuple[Any, ...]],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    transform: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    strict: bool = False,
) -> Feedback:
    """Compare ``fn(*args)`` with ``reference_fn(*args)`` on each tuple in ``inputs``.

    ``transform`` (e.g. ``jax.jit`` or ``jax.grad``) is applied to both functions first,
    so a checker can require that the answer works *under* a transformation.
    """
    if not inputs:
        raise ValueError("check_function needs at least one input tuple")
    problems: list[str] = []
    for k, args in enumerate(inputs):
        if not isinstance(args, tuple):
            raise TypeError(f"inputs[{k}] must be a tuple of positional arguments, got {type(args).__name__}")
        f = fn if transform is None else _safe_transform(transform, fn)
        got = call_answer(f, *args)
        want = (reference_fn if transform is None else transform(reference_fn))(*args)
        msg = failed(got)
        if msg:
            problems.append(f"on input #{k}: {msg}")
            break
        problems += [f"on input #{k}: {p}" for p in tree_mismatches(got, want, rtol=rtol, atol=atol)]
    return verdict(exercise, problems, success=f"agrees with the reference on {len(inputs)} input(s)", strict=strict)


def _safe_transform(transform: Callable[[Callable[..., Any]], Callable[..., Any]], fn: Any) -> Any:
    try:
        return transform(fn)
    except Exception as e:  # report the transformation's error when the answer is called
        error = e

        def raise_error(*args: Any, **kwargs: Any) -> Any:
            raise error

        return raise_error

"""Timing and memory of compiled JAX calls, with one clock policy for the whole book.

Policy (every figure, table and benchmark of the book uses it):

* the clock is wall time (:func:`time.perf_counter`), waiting for the result with
  :func:`jax.block_until_ready`. Process CPU time would add up XLA's threads on a
  CPU and count nothing while a GPU works, so wall time is the one clock that means
  the same on every backend;
* every function is called once before timing (compilation and caches), and then
  once more, untimed, right before each timed sample, so no function pays for caches
  that another one emptied;
* repeats are interleaved (round-robin over the functions compared), so a slow spell
  of a shared machine hits all of them alike;
* a sample loops until it lasts at least ``min_time`` seconds and reports the time per
  call; the result keeps the **minimum** (least disturbed) and the **median** of the
  samples.

Memory is XLA's own plan: the compiled program's temporary bytes from
``memory_analysis()``. A backend that reports none gives ``None`` (never 0).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from beyondgrad import _checks

__all__ = ["Timing", "compile_seconds", "temp_bytes", "time_call", "time_calls"]

Call = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call of one function: ``min`` and ``median`` over ``samples``.

    ``str()`` gives both in milliseconds.

    Attributes:
        min: the least of ``samples``, seconds per call.
        median: the median of ``samples``, seconds per call.
        samples: one entry per repeat, in the order taken: the seconds of one sample
            (a loop of calls lasting at least ``min_time``) divided by its number of
            calls.
    """

    min: float
    median: float
    samples: tuple[float, ...]

    def __str__(self) -> str:
        return f"min {self.min * 1e3:.3f} ms, median {self.median * 1e3:.3f} ms"


def _check_calls(calls: Sequence[Call]) -> list[Call]:
    out = []
    for k, item in enumerate(calls):
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and callable(item[0])
            and isinstance(item[1], tuple)
        ):
            raise TypeError(
                f"calls[{k}] must be a (function, args_tuple) pair, got {item!r:.80}"
            )
        out.append(item)
    if not out:
        raise ValueError("time_calls needs at least one (function, args) pair")
    return out


def time_calls(
    calls: Sequence[Call], *, repeats: int = 7, min_time: float = 0.0
) -> list[Timing]:
    """Time each ``fn(*args)`` of ``calls`` side by side, by the module's clock policy.

    ``repeats`` samples per function are taken round-robin; each sample is preceded by
    an untimed call of the same function and loops until it lasts ``min_time`` seconds.

    Args:
        calls: ``(fn, args)`` pairs; each is timed as ``fn(*args)``.
        repeats: samples per function, an int >= 1.
        min_time: the least seconds one sample lasts (a sample loops the call).

    Returns:
        One :class:`Timing` per pair, in order.

    Raises:
        TypeError: a pair that is not ``(function, tuple)``; a non-int ``repeats``.
        ValueError: no pairs; ``repeats < 1``; ``min_time < 0``.
    """
    calls = _check_calls(calls)
    _checks.integer(repeats, "repeats", minimum=1)
    _checks.number(min_time, "min_time", at_least=0, meaning="seconds")
    for fn, args in calls:  # compile, fill caches
        jax.block_until_ready(fn(*args))
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for k, (fn, args) in enumerate(calls):
            jax.block_until_ready(fn(*args))  # untimed: this function's caches are warm
            n, t0 = 0, time.perf_counter()
            while True:
                jax.block_until_ready(fn(*args))
                n += 1
                dt = time.perf_counter() - t0
                if dt >= min_time:
                    break
            samples[k].append(dt / n)
    return [Timing(min(s), statistics.median(s), tuple(s)) for s in samples]


def time_call(
    fn: Callable[..., Any], *args: Any, repeats: int = 7, min_time: float = 0.0
) -> Timing:
    """:func:`time_calls` for one function.

    Args:
        fn: the function timed as ``fn(*args)``.
        *args: its arguments.
        repeats: samples, an int >= 1.
        min_time: the least seconds one sample lasts.

    Returns:
        Its :class:`Timing`.
    """
    return time_calls([(fn, args)], repeats=repeats, min_time=min_time)[0]


def compile_seconds(fn: Callable[..., Any], *args: Any) -> float:
    """Wall seconds to trace, lower and compile ``jax.jit(fn)`` for ``args`` (no run).

    Args:
        fn: a function, jitted or not (a jitted one's own lowering is used).
        *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
        Seconds, a float.
    """
    _checks.function(fn, "fn")
    jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
    t0 = time.perf_counter()
    jitted.lower(*args).compile()
    return time.perf_counter() - t0


def temp_bytes(fn: Callable[..., Any], *args: Any) -> int | None:
    """Temporary bytes XLA plans for ``jax.jit(fn)(*args)``; ``None`` if not reported.

    ``fn`` may already be jitted (its own lowering is then reused).

    Args:
        fn: a function, jitted or not.
        *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
        The compiled program's temporary bytes, or None where the backend does not
        report them.
    """
    _checks.function(fn, "fn")
    jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted.lower(*args).compile()
    try:
        analysis = compiled.memory_analysis()
    except (NotImplementedError, jax.errors.JaxRuntimeError):
        return None
    value = (
        getattr(analysis, "temp_size_in_bytes", None) if analysis is not None else None
    )
    return None if value is None else int(value)

"""How long each exercise checker takes to answer an endless Python loop, with CPU hogs.

Every public checker of ``beyondgrad.exercises`` gets an answer that never returns (a
``while True`` loop in Python, whatever it is called with). The tool prints, per
checker, the limit its message names, the seconds until the checker answered, the
seconds the message says it waited, and how many ``beyondgrad-check`` threads still run
after it answered (0 expected: a Python loop is stopped). ``--hogs N`` starts ``N``
busy Python processes beside it (nice 0, each ending by itself after the run), as on a
busy 2-vCPU runtime. The promise tested is: answered within the printed limit + 5 s.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python tools/endless_loop_timing.py --hogs 2
    PYTHONPATH=src .venv/bin/python tools/endless_loop_timing.py --hogs 2 --only 6.1

(the hogs inherit the tool's niceness: under ``nice -n 15`` they load the machine as
much relative to the checker, and leave other work on it alone).

With ``--compiled`` each checker's answer runs an endless *compiled* loop instead: a
``lax.while_loop`` whose condition never turns false, under ``jit`` (run eagerly where
the checker calls the answer outside a transformation, traced into the checker's
program where it calls it under ``jit``, ``vmap``, ``grad`` or inside the
``shard_map`` body, as a student's loop would be). Nothing can stop that loop from
Python (the thread spins until the process ends), so each checker runs in a
subprocess of its own, which ends with ``os._exit``. The promise there: answered
within the printed limit + 5 s, with the restart note (:data:`RESTART_NOTE_MARKS`:
the answer still runs, compiled code cannot be interrupted, restart the kernel)::

    nice -n 15 env PYTHONPATH=src .venv/bin/python tools/endless_loop_timing.py \
        --compiled --hogs 2

Exit status 1 if a checker breaks the promise or leaves a thread running.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: Seconds beyond its printed limit a checker may take to answer (issue #44).
PROMISED_MARGIN = 5.0

_HOG = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def _endless(*args: Any, **kwargs: Any) -> Any:
    """An answer that never returns, in Python code (stoppable by the checkers)."""
    n = 0
    while True:
        n += 1


#: What a message must say after an endless compiled loop: that the answer still runs,
#: why it cannot be stopped, and that a restart is needed.
RESTART_NOTE_MARKS = (
    "still running in the background",
    "cannot be interrupted",
    "restart the kernel",
)


def _loop(x: Any) -> Any:
    """``x`` after a ``lax.while_loop`` that never ends: its condition reads a carried
    1 that the body never changes (no counter that could wrap around)."""
    from jax import lax

    return lax.while_loop(lambda c: c[1] >= 0, lambda c: (c[0] + 1.0, c[1]), (x, 1))[0]


#: :func:`_loop` compiled ahead of time for a float32 scalar (:func:`_compile_loop`,
#: before the clock starts), so that an eager call spends the check's time in the
#: loop, not in compiling it on a loaded machine.
_COMPILED_LOOP: list[Any] = []


def _compile_loop() -> None:
    import jax
    import jax.numpy as jnp

    _COMPILED_LOOP.append(jax.jit(_loop).lower(jnp.float32(0)).compile())


def _never_ends(seed: Any) -> Any:
    """:func:`_loop` of ``seed``: the compiled one for a concrete seed, traced into the
    caller's program for a traced one."""
    import jax

    if _COMPILED_LOOP and not isinstance(seed, jax.core.Tracer):
        return _COMPILED_LOOP[0](seed)
    return jax.jit(_loop)(seed)


def _spin(like: Any) -> Any:
    """An endless compiled loop started from ``like`` (an array or a tracer, its value
    not differentiated): waited for when it runs eagerly (so that the answer never
    returns), part of the caller's program when ``like`` is traced."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    seed = lax.stop_gradient(jnp.sum(jnp.asarray(like)).astype(jnp.float32)) * 0.0
    count = _never_ends(seed)
    if not isinstance(count, jax.core.Tracer):
        count.block_until_ready()  # never returns
    return count


def _endless_compiled(*args: Any, **kwargs: Any) -> Any:
    """An answer whose compiled loop never ends: the loop starts from the first array
    it is given and the answer returns its first non-function argument (arrays shifted
    by ``0 * loop``, so the loop is part of what the checker computes), or runs the
    loop eagerly when given no array (an answer called with no arguments)."""
    import jax
    import jax.numpy as jnp

    given = [a for a in args if not callable(a)]
    leaves = [
        x for x in jax.tree.leaves(given) if hasattr(x, "shape") and hasattr(x, "dtype")
    ]
    count = _spin(leaves[0] if leaves else jnp.float32(0))
    if not given:
        return count
    return jax.tree.map(
        lambda x: (
            x + (0 * count).astype(x.dtype)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
            else x
        ),
        given[0],
    )


def _endless_row_sums(xb: Any) -> Any:
    """Exercise 4.3's body with an endless loop: the row sums (psum over ``model``,
    so the result does not vary over it, as ``out_specs=P("data")`` needs) carried by
    a ``while_loop`` whose condition never turns false."""
    from jax import lax

    sums = lax.psum(xb.sum(1), "model")
    return lax.while_loop(
        lambda c: c[1] >= 0, lambda c: (c[0] + sums, c[1]), (0.0 * sums, 1)
    )[0]


def _endless_jacobian(f: Callable[..., Any], params: Any) -> Any:
    """Exercise 2.2: zeros of the Jacobian's structure and shapes after the loop."""
    import jax
    import jax.numpy as jnp

    count = _spin(jax.tree.leaves(params)[0])
    return jax.tree.map(
        lambda o: jax.tree.map(
            lambda p: jnp.zeros(o.shape + p.shape, p.dtype) + 0 * count, params
        ),
        jax.eval_shape(f, params),
    )


def _endless_second_derivative(a: Any, i: Any, u: Any) -> Any:
    """Exercise 5.2: a scalar after the loop."""
    return 0 * _spin(a)


def _endless_variance_step(params: Any, walkers: Any) -> Any:
    """Exercise 5.3: ``(variance, gradient)``, invariant (the loop starts from the
    invariant ``params``), after the loop."""
    import jax

    count = _spin(jax.tree.leaves(params)[0])
    return 0 * count, jax.tree.map(
        lambda p: p * 0 + (0 * count).astype(p.dtype), params
    )


def _endless_per_walker_grads(w: Any, x: Any) -> Any:
    """Exercise 6.2: one gradient of ``w``'s shape per local point, after the loop."""
    import jax.numpy as jnp

    count = _spin(x)
    return jnp.zeros(x.shape[:1] + w.shape, w.dtype) + (0 * count).astype(w.dtype)


#: Answers with an endless compiled loop where :func:`_endless_compiled` does not fit:
#: its result would vary over an axis the ``shard_map``'s out_specs leave out (an
#: error at trace time, before the loop runs), or have another structure or shape
#: than the checker expects (a verdict from shapes alone, while the loop runs on).
_COMPILED_ANSWERS: dict[str, Callable[..., Any]] = {
    "2.2": _endless_jacobian,
    "4.3": _endless_row_sums,
    "5.2": _endless_second_derivative,
    "5.3": _endless_variance_step,
    "6.2": _endless_per_walker_grads,
}


def _checkers() -> dict[str, Callable[..., Any]]:
    from beyondgrad.exercises import ch1, ch2, ch3, ch4, ch5, ch6

    return {
        "1.1": ch1.check_fix_jit,
        "1.2": ch1.check_predict_retraces,
        "1.3a": ch1.check_nan_interval,
        "1.3": ch1.check_finite_grad,
        "2.1": ch2.check_transpose,
        "2.2": ch2.check_rebuilt_jacrev,
        "2.3": ch2.check_jacobian_strategy,
        "3.1": ch3.check_fixed_point_grad,
        "3.2": ch3.check_sqrtm,
        "3.3": ch3.check_tolerance_fix,
        "4.1": ch4.check_predict_vma,
        "4.2": ch4.check_sharded_step,
        "4.3": ch4.check_two_axis_carry,
        "5.1": ch5.check_fl_multiply,
        "5.2": ch5.check_row_update_second_derivative,
        "5.3": ch5.check_sharded_variance_step,
        "6.1": ch6.check_clip,
        "6.2": ch6.check_per_walker_grads,
    }


def _live_check_threads() -> int:
    """Checker threads the OS still runs (``is_alive()`` alone can be wrong after an
    interrupted ``join``)."""
    return sum(
        1
        for t in threading.enumerate()
        if t.name == "beyondgrad-check"
        and (t.is_alive() or os.path.exists(f"/proc/self/task/{t.native_id}"))
    )


def _one_compiled(name: str) -> None:
    """Run checker ``name`` on an endless compiled loop (in this process, which the
    loop then keeps busy): print one JSON line with the seconds it took and its text,
    then end the process (the loop cannot be stopped otherwise)."""
    from beyondgrad import runtime

    runtime.ensure_cpu_devices(runtime.BOOK_DEVICE_COUNT)
    _compile_loop()
    check = _checkers()[name]
    answer = _COMPILED_ANSWERS.get(name, _endless_compiled)
    start = time.monotonic()
    text = str(check(answer))
    took = time.monotonic() - start
    print(json.dumps({"took": took, "text": text}), flush=True)
    os._exit(0)


#: Seconds after which a checker's subprocess counts as never answering.
_NO_ANSWER = 300


def _run_compiled(name: str) -> tuple[float, str]:
    """(seconds, message) of checker ``name`` on an endless compiled loop, from a
    subprocess of its own (:func:`_one_compiled`)."""
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--compiled-one", name],
            capture_output=True,
            text=True,
            timeout=_NO_ANSWER,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
    except subprocess.TimeoutExpired:
        return float("inf"), f"(no answer within {_NO_ANSWER} s: the checker waits)"
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            found = json.loads(line)
            return float(found["took"]), str(found["text"])
    return float("nan"), f"(no answer; exit {out.returncode}) {out.stderr[-1500:]}"


def _main_compiled(chosen: list[str]) -> int:
    """The ``--compiled`` table: limit, seconds to answer, seconds the message says it
    waited, and whether it has the restart note (:data:`RESTART_NOTE_MARKS`)."""
    bad = 0
    print(f"{'exercise':8} {'limit':>6} {'answered':>9} {'waited':>7} restart-note")
    for name in chosen:
        took, text = _run_compiled(name)
        limit = re.search(r"within ([0-9.]+) s", text)
        waited = re.search(r"(?:waiting|stopped) after ([0-9.]+) s", text)
        lim = float(limit.group(1)) if limit else float("nan")
        note = all(mark in text for mark in RESTART_NOTE_MARKS)
        ok = bool(limit) and took <= lim + PROMISED_MARGIN and note
        bad += not ok
        print(
            f"{name:8} {lim:6g} {took:9.1f} "
            f"{float(waited.group(1)) if waited else float('nan'):7.1f} "
            f"{'yes' if note else 'NO':>12}{'' if ok else '  <-- broken'}",
            flush=True,
        )
        if not ok:
            print("    " + text.replace("\n", "\n    "), flush=True)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside")
    parser.add_argument("--only", nargs="*", help="exercise numbers (default: all)")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="an endless compiled loop (lax.while_loop) per checker, each checker "
        "in a subprocess of its own",
    )
    parser.add_argument("--compiled-one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.compiled_one:
        _one_compiled(args.compiled_one)
    checkers = _checkers()
    chosen = args.only or list(checkers)
    unknown = [c for c in chosen if c not in checkers]
    if unknown:
        parser.error(f"unknown exercises {unknown}; known: {list(checkers)}")
    if args.compiled:
        hogs = [
            subprocess.Popen([sys.executable, "-c", _HOG.format(s=200.0 * len(chosen))])
            for _ in range(args.hogs)
        ]
        try:
            time.sleep(0.5)
            return _main_compiled(chosen)
        finally:
            for p in hogs:
                p.kill()
                p.wait()

    from beyondgrad import runtime

    runtime.ensure_cpu_devices(runtime.BOOK_DEVICE_COUNT)

    hogs = [
        subprocess.Popen([sys.executable, "-c", _HOG.format(s=120.0 * len(chosen))])
        for _ in range(args.hogs)
    ]
    bad = 0
    try:
        time.sleep(0.5)
        print(f"{'exercise':8} {'limit':>6} {'answered':>9} {'waited':>7} threads")
        for name in chosen:
            start = time.monotonic()
            text = str(checkers[name](_endless))
            took = time.monotonic() - start
            time.sleep(0.2)  # a stopped thread has unwound
            threads = _live_check_threads()
            limit = re.search(r"within ([0-9.]+) s", text)
            waited = re.search(r"(?:waiting|stopped) after ([0-9.]+) s", text)
            lim = float(limit.group(1)) if limit else float("nan")
            ok = bool(limit) and took <= lim + PROMISED_MARGIN and threads == 0
            bad += not ok
            print(
                f"{name:8} {lim:6g} {took:9.1f} "
                f"{float(waited.group(1)) if waited else float('nan'):7.1f} "
                f"{threads:7d}{'' if ok else '  <-- broken'}",
                flush=True,
            )
            if not ok:
                print("    " + text.replace("\n", "\n    "), flush=True)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

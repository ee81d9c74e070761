"""The package's one argument-checking policy (every public function checks through here).

* **Wrong kind** (a value of the wrong type: a number where a function is expected, a
  ``bool`` or float where an int is, an integer array where a floating one is) and
  **an option the chosen method ignores** raise ``TypeError``.
* **Wrong value** (the right kind, out of range or not one of the choices) raises
  ``ValueError``.
* Every message names the argument, what was given, and the fix (what to pass).

``where`` (e.g. ``"fixed_point: "``) prefixes a message with the function that checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np


def is_int(value: object) -> TypeGuard[int]:
    """A Python int (``bool`` excluded: ``True`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[float]:
    """A Python int or float (``bool`` excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _got(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def function(
    value: object,
    name: str,
    kind: str = "a function",
    *,
    where: str = "",
    example: str = "",
) -> Callable[..., Any]:
    """``value``, after a ``TypeError`` unless it is callable.

    Args:
        value: the argument.
        name: its name, for the message.
        kind: what it must be, e.g. ``"a function f(x, params)"``.
        where: a prefix naming the checking function.
        example: a value to pass, shown as ``(e.g. ...)``.

    Returns:
        ``value``.
    """
    if not callable(value):
        hint = f" (e.g. {example})" if example else ""
        raise TypeError(
            f"{where}{name} must be {kind}, got {type(value).__name__}; pass the "
            f"function itself, not its value{hint}"
        )
    return value


def integer(
    value: object,
    name: str,
    *,
    minimum: int | None = None,
    meaning: str = "",
    where: str = "",
) -> int:
    """``value`` as an int: ``TypeError`` unless a Python int (not bool),
    ``ValueError`` if below ``minimum``.

    Args:
        value: the argument.
        name: its name, for the message.
        minimum: the smallest allowed value, or None.
        meaning: what the number counts, e.g. ``"the number of Metropolis steps"``.
        where: a prefix naming the checking function.

    Returns:
        ``value``.
    """
    if minimum is None:
        desc = "an int"
    else:
        desc = {0: "a non-negative int", 1: "a positive int"}.get(
            minimum, f"an int >= {minimum}"
        )
    notes = [f"an int >= {minimum}"] if minimum in (0, 1) else []
    notes += [meaning] if meaning else []
    about = f" ({'; '.join(notes)})" if notes else ""
    if not is_int(value):
        example = 1 if minimum is None else max(minimum, 1)
        kind = "a Python int" + ("" if minimum is None else f", {desc}")
        hint = f", e.g. {name}={example}" if name.isidentifier() else ""
        raise TypeError(f"{where}{name} must be {kind}{about}{hint}, got {_got(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}{name} must be {desc}{about}, got {value!r}")
    return value


def seed(value: object, name: str = "seed", *, where: str = "") -> int | None:
    """``value`` as a seed: ``None`` (fresh entropy) or an int (NumPy integers too,
    ``bool`` excluded); anything else is a ``TypeError``.

    Args:
        value: the argument.
        name: its name, for the message.
        where: a prefix naming the checking function.

    Returns:
        ``None`` or ``int(value)``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(
            f"{where}{name} must be an int or None (None draws a fresh one), "
            f"got {_got(value)}"
        )
    return int(value)


def number(
    value: object,
    name: str,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    meaning: str = "",
    example: str = "",
    where: str = "",
) -> float:
    """``value`` as a float: ``TypeError`` unless a Python int or float (not bool),
    ``ValueError`` outside the bounds given (``above``/``below`` exclusive,
    ``at_least`` inclusive; NaN is outside every bound).

    Args:
        value: the argument.
        name: its name, for the message.
        above: ``value`` must be ``> above``.
        at_least: ``value`` must be ``>= at_least``.
        below: ``value`` must be ``< below``.
        meaning: what the number is, e.g. ``"seconds"``.
        example: a good value, shown as ``e.g. name=example``.
        where: a prefix naming the checking function.

    Returns:
        ``float(value)``.
    """
    parts = [
        f"> {above}" if above is not None else "",
        f">= {at_least}" if at_least is not None else "",
        f"< {below}" if below is not None else "",
    ]
    bound = " and ".join(p for p in parts if p)
    desc = f"a float {bound}" if bound else "a float"
    notes = ["positive"] if parts == ["> 0", "", ""] else []
    notes += [meaning] if meaning else []
    about = f" ({'; '.join(notes)})" if notes else ""
    hint = f", e.g. {name}={example}" if example else ""
    if not is_real(value):
        kind = f" ({'; '.join([*notes, 'a Python number'])})"
        raise TypeError(f"{where}{name} must be {desc}{kind}{hint}, got {_got(value)}")
    ok = (
        (above is None or value > above)
        and (at_least is None or value >= at_least)
        and (below is None or value < below)
    )
    if not ok:
        raise ValueError(f"{where}{name} must be {desc}{about}{hint}, got {value!r}")
    return float(value)


def boolean(
    value: object, name: str, *, none_ok: bool = False, where: str = ""
) -> bool | None:
    """``TypeError`` unless ``value`` is ``True`` or ``False`` (or None, with
    ``none_ok``).

    Args:
        value: the argument.
        name: its name, for the message.
        none_ok: accept None too.
        where: a prefix naming the checking function.

    Returns:
        ``value``.
    """
    if value is None and none_ok:
        return None
    if not isinstance(value, bool):
        allowed = "None, True or False" if none_ok else "True or False"
        raise TypeError(f"{where}{name} must be {allowed}, got {_got(value)}")
    return value


def choice(
    value: object,
    name: str,
    choices: tuple[str, ...],
    *,
    about: str = "",
    where: str = "",
) -> str:
    """``ValueError`` unless ``value`` is one of ``choices``; the message reads
    ``unknown <name> <value>: <name> must be one of <choices>``.

    Args:
        value: the argument.
        name: what it names, e.g. ``"Laplacian method"``.
        choices: the allowed strings.
        about: more that is accepted or meant, appended to the list.
        where: a prefix naming the checking function.

    Returns:
        ``value``.
    """
    if not isinstance(value, str) or value not in choices:
        more = f" {about}" if about else ""
        raise ValueError(
            f"{where}unknown {name} {value!r}: {name} must be one of "
            f"{', '.join(map(repr, choices))}{more}"
        )
    return value


def ignored_option(
    option: str, value: object, owner: str, chosen: str, *, key: str = "method"
) -> None:
    """``TypeError``: ``option`` was given, but only ``key=owner`` reads it and
    ``key=chosen`` would ignore it.

    Args:
        option: the option's name.
        value: the value given (shown when a number).
        owner: the choice that reads the option.
        chosen: the choice made, which would ignore it.
        key: the argument that chooses, e.g. ``"method"`` or ``"solver"``.
    """
    shown = (
        f"{option}={value!r}"
        if is_real(value)
        else f"{option} (a {type(value).__name__})"
    )
    raise TypeError(
        f"{shown} applies only to {key}={owner!r}, not to {key}={chosen!r}, which "
        f"would ignore it: drop {option} or use {key}={owner!r}"
    )


def float_leaves(
    tree: Any,
    name: str,
    *,
    complex_ok: bool = False,
    why: str = "",
    fix: str = "cast it, e.g. x.astype(jnp.float32)",
    empty: str = "",
    where: str = "",
) -> None:
    """``TypeError`` unless every leaf of ``tree`` is a floating-point array (or complex,
    with ``complex_ok``); ``ValueError`` for a tree with no leaves when ``empty`` says
    what to pass instead.

    Args:
        tree: a pytree of arrays.
        name: its name, for the message (a leaf is named ``name`` + its path).
        complex_ok: accept complex leaves too.
        why: why the leaves must be floating-point, e.g. ``"a gradient is taken"``.
        fix: what to do instead.
        empty: the message's fix for an empty tree; ``""`` accepts an empty tree.
        where: a prefix naming the checking function.
    """
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    if not leaves and empty:
        raise ValueError(f"{where}{name} has no array leaves; {empty}")
    kind = "float or complex (floating-point)" if complex_ok else "floating-point"
    wanted = jnp.inexact if complex_ok else jnp.floating
    because = f" ({why})" if why else ""
    for path, leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, wanted):
            raise TypeError(
                f"{where}{name}{jax.tree_util.keystr(path)} has dtype {dtype}; every "
                f"leaf of {name} must be a {kind} array{because}: {fix}"
            )


def instance(value: object, kind: type | tuple[type, ...], message: str) -> None:
    """``TypeError(message)`` unless ``value`` is an instance of ``kind``.

    Args:
        value: the argument.
        kind: the class (or classes) it must be an instance of.
        message: the whole message: the argument, what was given and the fix.
    """
    if not isinstance(value, kind):
        raise TypeError(message)


def function_first(fn: object, value: object, call: str) -> None:
    """``TypeError`` when a function and a value were passed the wrong way round: a
    value where the function goes and a function where the value goes.

    Args:
        fn: the argument that must be the function.
        value: the argument that must not be.
        call: the right call, e.g. ``"forward_laplacian(fn, r)"``.
    """
    if callable(value) and not callable(fn):
        name = call.split("(")[0]
        order = call[len(name) :]
        raise TypeError(
            f"{name} takes {order}: got an array first and a function second; "
            f"call {call}"
        )


def point(value: object, name: str, *, batch: str = "", where: str = "") -> jax.Array:
    """``value`` as a 1-D floating-point array: ``ValueError`` for another shape (a
    wrong value), ``TypeError`` for an integer, boolean or complex dtype (a wrong
    kind).

    Args:
        value: the argument (anything ``jnp.asarray`` takes).
        name: its name, for the message.
        batch: more advice for a batch of points, appended to the shape message
            (e.g. ``"; for a batch of points use jax.vmap over laplacian"``).
        where: a prefix naming the checking function.

    Returns:
        ``jnp.asarray(value)``.
    """
    x = jnp.asarray(value)
    if x.ndim != 1:
        raise ValueError(
            f"{where}{name} must be a 1-D array (flatten it, e.g. {name}.reshape(-1)), "
            f"got shape {x.shape}{batch}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"{where}{name} must be a floating-point array (e.g. "
            f"{name}.astype(jnp.float32)), got dtype {x.dtype}"
        )
    return x


def divisor(
    value: object,
    total: int,
    name: str,
    *,
    total_name: str,
    meaning: str = "",
    fix: str = "",
    where: str = "",
) -> int:
    """``value`` as a positive int dividing ``total``: ``TypeError`` unless a Python
    int (not bool), ``ValueError`` if below 1 or not a divisor of ``total``.

    Args:
        value: the argument.
        total: the number it must divide.
        name: its name, for the message.
        total_name: what ``total`` is, e.g. ``"the input size d"``.
        meaning: what the number counts, for the kind message.
        fix: what to pass instead, appended to the divisor message.
        where: a prefix naming the checking function.

    Returns:
        ``value``.
    """
    count = integer(value, name, minimum=1, meaning=meaning, where=where)
    if total % count:
        hint = f"; {fix}" if fix else ""
        raise ValueError(
            f"{where}{name}={value} does not divide {total_name} = {total}{hint}"
        )
    return count

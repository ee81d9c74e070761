"""Helpers for the Beyond grad book.

The ideas, one module each: ``tracers`` (Chapter 1), ``linear`` (2), ``implicit`` (3),
``sharding`` (4), and for Chapter 5 ``laplacian`` (methods for the Laplacian),
``forward_laplacian`` (the interpreter), ``slater`` (determinants and the row formula),
``wavefunctions`` (a ready-made model) and ``vmc`` (energies, walkers, gradients).
Around them: ``runtime`` (devices, meshes, versions), ``compat`` (the one place that
knows JAX's version differences and private APIs) and ``measure`` (timing and memory). The teaching apparatus lives apart:
``exercises`` (checkers, one module per chapter) and ``figures`` (plots and widget
callbacks). Import the module you need: ``from beyondgrad import runtime``. Importing
any of them starts no JAX backend.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["JAX_FLOOR", "__version__"]

#: The helper package's version.
__version__ = "0.1.0"


def _jax_floor() -> str:
    """The oldest supported JAX: the ``jax>=`` requirement of ``pyproject.toml``.

    In a checkout (``src/`` on ``PYTHONPATH``, installed or not) the file itself is
    read; an installed wheel reads the same requirement from its metadata.
    """
    import re

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        data = tomllib.loads(pyproject.read_text())
        if data.get("project", {}).get("name") == "beyondgrad":
            for dep in data["project"].get("dependencies", []):
                m = re.fullmatch(r"jax\s*>=\s*([0-9.]+)", dep.strip())
                if m:
                    return m.group(1)
    from importlib.metadata import PackageNotFoundError, requires

    try:
        for req in requires("beyondgrad") or []:
            m = re.fullmatch(r"jax\s*>=\s*([0-9.]+)", req.split(";")[0].strip())
            if m:
                return m.group(1)
    except PackageNotFoundError:
        pass
    raise RuntimeError(
        "cannot find the supported JAX floor: neither pyproject.toml next to src/ nor "
        "installed beyondgrad metadata; install with `pip install -e .` or run from a checkout"
    )


#: The oldest JAX the book and its helpers support (``jax>=`` in pyproject.toml).
JAX_FLOOR: str = _jax_floor()

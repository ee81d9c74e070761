"""Helpers for the Beyond grad book.

One module per chapter topic (``tracers``, ``linear``, ``implicit``, ``sharding``,
``laplacian``), plus ``runtime`` (devices, meshes, versions), ``compat`` (APIs that
moved inside the supported JAX range) and ``exercises`` (checkers).
Import the module you need: ``from beyondgrad import runtime``.
"""

__version__ = "0.1.0"


def _jax_floor() -> str:
    """The oldest supported JAX, read from this package's own ``jax>=`` requirement."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        for req in requires("beyondgrad") or []:
            name, _, rest = req.partition(">=")
            if name.strip() == "jax":
                return rest.split(",")[0].split(";")[0].strip()
    except PackageNotFoundError:
        pass
    raise RuntimeError("beyondgrad is not installed with its metadata: pip install -e . (or the Colab cell)")


#: The oldest JAX the book and its helpers support (from pyproject.toml, via the metadata).
JAX_FLOOR = _jax_floor()

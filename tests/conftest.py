"""Test session set-up: 8 CPU devices before anything touches JAX (as in the chapters),
and JAX's persistent compilation cache when dev.py names one.

``$BEYONDGRAD_JAX_CACHE`` (set by ``dev.py test``: a folder outside the checkout, one
per environment) turns on JAX's persistent compilation cache for the test processes
(each xdist worker): a program compiled by an earlier run on this machine is read back
instead of compiled again. Every program is cached (no minimum compile time). Chapters
executed by the tests run in their own kernels, without it. Without the variable
(pytest run directly) nothing is cached; the tests pass either way.

A test that logs, explains or counts compilations (its source names ``jax_log``,
``jax_log_compiles``, ``jax_explain_cache_misses``, ``compile_seconds``,
``jit_cache_size`` or ``CompilationCounter``), or carries the marker
``no_compile_cache``, runs with the cache off: JAX logs persistent-cache misses and hits
among those messages, and what such a test sees must not depend on what an earlier run
left behind.

In the same folder the suite keeps the result of ``laplacian.folx_wrong_constructs()``
(folx's self-probe: three folx Laplacians and three Hessians, compiled op by op), keyed
on ``laplacian.py``'s source; the folder is already one per set of installed versions.
The probe is deterministic, so each worker of a later run reads what the first
measured instead of measuring again.
"""

import functools
import hashlib
import inspect
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ is importable from the tests

from beyondgrad import runtime  # noqa: E402

runtime.ensure_cpu_devices(runtime.BOOK_DEVICE_COUNT)

import jax  # noqa: E402

JAX_CACHE_VARIABLE = "BEYONDGRAD_JAX_CACHE"
#: Words in a test's source that mark it as observing compilation (cache off for it).
OBSERVES_COMPILATION = (
    "jax_log",
    "jax_log_compiles",
    "jax_explain_cache_misses",
    "compile_seconds",
    "jit_cache_size",
    "CompilationCounter",
)

_cache_dir = os.environ.get(JAX_CACHE_VARIABLE, "").strip()
if _cache_dir:
    jax.config.update("jax_compilation_cache_dir", _cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def _keep_folx_probe(folder: Path) -> None:
    """Read ``folx_wrong_constructs()`` from ``folder`` when an earlier run measured it
    with this ``laplacian.py`` (module docstring); measure and keep it otherwise."""
    from beyondgrad import laplacian

    measure = getattr(laplacian, "folx_wrong_constructs", None)
    if measure is None:
        return
    source = Path(laplacian.__file__).read_bytes()
    kept = (
        folder / f"folx_wrong_constructs-{hashlib.sha256(source).hexdigest()[:16]}.json"
    )

    @functools.cache
    def folx_wrong_constructs() -> tuple[str, ...]:
        if kept.exists():
            return tuple(json.loads(kept.read_text()))
        wrong = measure()
        tmp = kept.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(list(wrong)))
        os.replace(tmp, kept)
        return wrong

    folx_wrong_constructs.__doc__ = measure.__doc__
    laplacian.folx_wrong_constructs = folx_wrong_constructs


if _cache_dir:
    _keep_folx_probe(Path(_cache_dir))


#: No test may hang CI: each test gets at most this many seconds (pytest-timeout).
TEST_TIMEOUT_S = 900


#: Environment variable naming the part of the suite to run: unset or ``all`` (the
#: default: every test) or ``versions`` (every test not marked ``one_env``). CI's lock
#: and floor environments run ``versions``; its newest environment runs all.
SUITE_VARIABLE = "BEYONDGRAD_SUITE"
SUITES = ("all", "versions")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "no_compile_cache: run without JAX's persistent compilation cache",
    )
    config.addinivalue_line(
        "markers",
        "one_env: what the test checks does not change with the JAX release (the "
        "repository's tooling and texts, wall-clock time limits on a loaded machine): "
        f"{SUITE_VARIABLE}=versions leaves it out (CI runs it in one environment)",
    )


def suite() -> str:
    """The part of the suite this run selects (:data:`SUITE_VARIABLE`)."""
    name = os.environ.get(SUITE_VARIABLE, "").strip() or "all"
    if name not in SUITES:
        raise pytest.UsageError(
            f"{SUITE_VARIABLE}={name!r}: use one of {', '.join(SUITES)} (or unset it)"
        )
    return name


def pytest_collection_modifyitems(config, items):
    """Under ``BEYONDGRAD_SUITE=versions`` the tests marked ``one_env`` are deselected.
    Every test without its own ``timeout`` marker gets :data:`TEST_TIMEOUT_S`, when
    pytest-timeout is installed (the toolchain has it; a bare ``pytest`` without it runs
    the same tests without a limit)."""
    if suite() == "versions":
        left_out = [item for item in items if item.get_closest_marker("one_env")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [
                item for item in items if not item.get_closest_marker("one_env")
            ]
    if not config.pluginmanager.hasplugin("timeout"):
        return
    if config.getoption("timeout", None):  # --timeout on the command line wins
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


def _observes_compilation(item) -> bool:
    if item.get_closest_marker("no_compile_cache") is not None:
        return True
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return any(word in source for word in OBSERVES_COMPILATION)


@pytest.fixture(autouse=True)
def _compile_cache_off_where_observed(request):
    """The persistent cache off for a test that observes compilation (module doc)."""
    if not _cache_dir or not _observes_compilation(request.node):
        yield
        return
    # JAX decides once per process whether the cache is used (is_cache_used);
    # reset_cache() makes it decide again, now with the cache disabled, and after.
    from jax._src import compilation_cache

    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()

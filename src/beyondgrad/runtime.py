"""Where the book runs: platform detection, simulated CPU devices and demo meshes.

Every chapter's setup cell calls :func:`ensure_cpu_devices` (multi-device chapters)
and prints :func:`describe`. :func:`demo_mesh` gives the sharding chapters a mesh on
real accelerators when there are enough of them and on simulated CPU devices
otherwise, so the same cell runs on a laptop, a 1-GPU Colab runtime and a TPU.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform as _platform
import sys
from collections.abc import Sequence
from typing import Literal

import jax

from beyondgrad import _checks, compat, drift

__all__ = [
    "BOOK_DEVICE_COUNT",
    "DriftCheck",
    "DriftDifference",
    "RuntimeInfo",
    "SetupCheck",
    "check_my_jax",
    "check_setup",
    "demo_mesh",
    "describe",
    "ensure_cpu_devices",
    "glue",
    "on_colab",
]

#: How many devices the sharding chapters use (simulated on CPU when needed).
BOOK_DEVICE_COUNT = 8


def glue(name: str, value: object, display: bool = True) -> None:
    """Make ``value`` available to the prose as ``{glue}`name```: myst-nb's ``glue``.

    The built book reads glued values from the executed notebook. Where myst-nb is not
    installed (Colab) nothing is printed for ``display=False``: the notebook's prose
    quotes the build's value, marked as the build's (``tools/book.py``), and the cell's
    own printed output is the reader's; ``display=True`` shows the value itself, as
    myst-nb does, never a ``name = value`` line.

    Args:
        name: The key the prose cites, a non-empty str.
        value: The value to glue.
        display: Show the value in the cell's output as well.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is empty.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"glue name must be a str such as 'speedup' (the prose cites it as "
            f"{{glue}}`speedup`), got {type(name).__name__}: {name!r}"
        )
    if not name.strip():
        raise ValueError("glue name must be a non-empty str such as 'speedup'")
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as show

            show(value)
        return
    myst_glue(name, value, display=display)


def on_colab() -> bool:
    """True inside a Google Colab kernel.

    Returns:
        ``True`` if ``google.colab`` is imported or ``COLAB_RELEASE_TAG`` is set.
    """
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def ensure_cpu_devices(n: int = BOOK_DEVICE_COUNT) -> int:
    """Ask JAX for ``n`` CPU devices; return the number of CPU devices now visible.

    JAX reads ``jax_num_cpu_devices`` once, when it first initialises its backends
    (the first computation or device query of the process). Call this before that.
    Called later, it succeeds if at least ``n`` CPU devices already exist and
    otherwise raises ``RuntimeError`` telling you to restart the kernel.

    Args:
        n: the number of CPU devices wanted, an int ``>= 1``; the book's 8
            (:data:`BOOK_DEVICE_COUNT`) by default.

    Returns:
        The number of CPU devices JAX now has (``n``, or more if it had started with
        more).

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n < 1``.
        RuntimeError: JAX has already started with fewer than ``n`` CPU devices (the
            message says to restart the kernel).
    """
    _checks.integer(n, "n", minimum=1, meaning="the number of CPU devices")
    if not compat.backends_initialized():
        jax.config.update("jax_num_cpu_devices", n)
    have = len(jax.devices("cpu"))
    if have < n:
        raise RuntimeError(
            f"JAX already started with {have} CPU device(s), so {n} cannot be created now: "
            "jax_num_cpu_devices is read only once, before the first computation. "
            "Restart the kernel (Colab: Runtime > Restart session) and run the setup cell "
            "first, before anything else touches JAX."
        )
    return have


@dataclasses.dataclass(frozen=True)
class RuntimeInfo:
    """What produced a chapter's outputs (made by :func:`describe`).

    ``str()`` gives two or three readable lines; in a notebook the output also carries
    :meth:`as_dict` in its metadata.

    Attributes:
        platform: JAX's default backend, ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        device_kind: the kinds of the default backend's devices, sorted and joined
            by ``", "`` (e.g. ``"cpu"``, ``"NVIDIA H100 80GB HBM3"``).
        device_count: the number of devices of the default backend.
        cpu_device_count: the number of CPU devices.
        jax_version: ``jax.__version__``.
        jaxlib_version: the installed jaxlib's version.
        python_version: the Python version, e.g. ``"3.12.3"``.
        on_colab: whether the kernel runs on Google Colab (:func:`on_colab`).
    """

    platform: str  # "cpu", "gpu" or "tpu" (JAX's default backend)
    device_kind: str
    device_count: int  # devices of the default backend
    cpu_device_count: int
    jax_version: str
    jaxlib_version: str
    python_version: str
    on_colab: bool

    def as_dict(self) -> dict[str, object]:
        """The fields as a dict, ``{name: value}`` (:func:`dataclasses.asdict`)."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        where = "Colab" if self.on_colab else _platform.node() or "local"
        lines = [
            f"JAX {self.jax_version} (jaxlib {self.jaxlib_version}), Python {self.python_version}, on {where}",
            f"platform: {self.platform}, {self.device_count} x {self.device_kind}",
        ]
        if self.platform != "cpu":
            lines.append(f"CPU devices also available: {self.cpu_device_count}")
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None):
        # Readers see the text; the record rides along in the output's metadata, where
        # the book's status page reads it from the executed notebook.
        return {"text/plain": str(self)}, {"beyondgrad_runtime": self.as_dict()}


def _platform_name(backend: str) -> str:
    # JAX reports "cuda"/"rocm" for some GPU plugins and "gpu" for others.
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def describe() -> RuntimeInfo:
    """Platform, devices and versions of the running kernel.

    Starts JAX's backends if they have not started (it lists the devices).

    Returns:
        A :class:`RuntimeInfo`.
    """
    from importlib.metadata import version

    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    return RuntimeInfo(
        platform=_platform_name(jax.default_backend()),
        device_kind=", ".join(kinds),
        device_count=len(devices),
        cpu_device_count=len(jax.devices("cpu")),
        jax_version=jax.__version__,
        jaxlib_version=version("jaxlib"),
        python_version=_platform.python_version(),
        on_colab=on_colab(),
    )


def demo_mesh(
    shape: int | Sequence[int] = BOOK_DEVICE_COUNT,
    axis_names: str | Sequence[str] = ("data",),
    *,
    axis_types: Literal["auto", "explicit"] = "auto",
) -> jax.sharding.Mesh:
    """A mesh of ``prod(shape)`` devices: accelerators if there are enough, else CPU devices.

    ``axis_types`` is explicit because ``jax.make_mesh``'s default changed inside the
    supported range (Auto up to 0.8, Explicit from 0.9).

    Args:
        shape: The mesh's axis sizes (an int for one axis).
        axis_names: One distinct name per axis (a str for one axis).
        axis_types: ``"auto"`` or ``"explicit"`` sharding for every axis.

    Returns:
        A ``jax.sharding.Mesh`` of the first ``prod(shape)`` default devices, or of
        CPU devices when the default backend has fewer.

    Raises:
        ValueError: ``shape`` and ``axis_names`` differ in length, names repeat, or an
            axis size is below 1.
        TypeError: An axis size is not an int.
        RuntimeError: Not enough devices exist (the message names the fix).
    """
    shape_t = (shape,) if isinstance(shape, int) else tuple(shape)
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if len(shape_t) != len(names):
        raise ValueError(
            f"shape {shape_t} has {len(shape_t)} axes but axis_names {names} has {len(names)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"axis_names must be distinct, got {names}")
    for k, s in enumerate(shape_t):
        _checks.integer(s, f"shape[{k}]", meaning="a mesh axis size")
    if any(s < 1 for s in shape_t):
        raise ValueError(f"mesh shape entries must be positive ints, got {shape_t}")
    need = math.prod(shape_t)
    default = jax.devices()
    if len(default) >= need:
        devices = default[:need]
    else:
        cpus = jax.devices("cpu")
        if len(cpus) < need:
            raise RuntimeError(
                f"a {shape_t} mesh needs {need} devices; found {len(default)} {jax.default_backend()} "
                f"and {len(cpus)} CPU device(s). Call beyondgrad.runtime.ensure_cpu_devices({need}) "
                "first thing in a fresh kernel."
            )
        devices = cpus[:need]
    return compat.make_mesh(shape_t, names, axis_types=axis_types, devices=devices)


@dataclasses.dataclass(frozen=True)
class SetupCheck:
    """One line of the setup check: what was checked, whether it passed, the fix if not.

    ``str()`` gives ``✓ name: detail``, or ``✗ name: detail`` and the fix below it.

    Attributes:
        name: what was checked, e.g. ``"jit and grad"``.
        ok: whether the check passed.
        detail: what was found (for a check that raised, the exception).
        fix: what to do when it failed; empty for a check that cannot fail.
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        line = f"{'✓' if self.ok else '✗'} {self.name}: {self.detail}"
        return line if self.ok else f"{line}\n    fix: {self.fix}"


def _smoke_shard_map(mesh: jax.sharding.Mesh) -> float:
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def loss(w, x):  # per-shard partial loss, summed over the mesh
        return jax.lax.psum(jnp.sum((x * w) ** 2), mesh.axis_names)

    x = jnp.arange(float(mesh.size * 2))
    sharded = jax.jit(
        jax.shard_map(
            loss, mesh=mesh, in_specs=(P(), P(mesh.axis_names)), out_specs=P()
        )
    )
    got = float(sharded(2.0, x))
    want = float(jnp.sum((2.0 * x) ** 2))
    if abs(got - want) > 1e-4 * abs(want):
        raise AssertionError(f"shard_map sum {got} != single-device {want}")
    return got


def check_setup(n_devices: int = BOOK_DEVICE_COUNT) -> list[SetupCheck]:
    """Run the book's setup checks (devices, jit, grad, shard_map) and return one line each.

    The checks: the JAX version is at least the book's floor; at least ``n_devices``
    devices exist (accelerators or CPU devices); ``jit`` of a sum of sines and
    ``grad`` of :math:`\\sum x^3` match their closed forms; and, when enough devices
    exist, a ``psum`` under ``shard_map`` over a ``n_devices`` mesh matches the sum on
    one device. A check that raises is reported as failed (the exception in its
    ``detail``), not raised.

    Args:
        n_devices: the devices the sharding chapters need, an int; the book's 8
            (:data:`BOOK_DEVICE_COUNT`) by default.

    Returns:
        Four :class:`SetupCheck` s, in the order above.

    Raises:
        TypeError: ``n_devices`` is not an int.
        ValueError: ``n_devices`` is below 1.
    """
    _checks.integer(
        n_devices, "n_devices", minimum=1, meaning="devices", where="check_setup(): "
    )
    import jax.numpy as jnp

    from beyondgrad import JAX_FLOOR

    checks: list[SetupCheck] = []
    version = compat.jax_version()
    floor = tuple(int(p) for p in JAX_FLOOR.split("."))
    checks.append(
        SetupCheck(
            "JAX version",
            version >= floor,
            f"{jax.__version__} (the book supports {JAX_FLOOR} and newer)",
            f"upgrade JAX: pip install -U 'jax>={JAX_FLOOR}' (on Colab, pick a newer runtime version)",
        )
    )
    n_cpu = len(jax.devices("cpu"))
    n_acc = len(jax.devices())
    enough = max(n_cpu, n_acc) >= n_devices
    checks.append(
        SetupCheck(
            f"{n_devices} devices for the sharding chapters",
            enough,
            f"{n_acc} {jax.default_backend()} device(s), {n_cpu} CPU device(s)",
            f"restart the kernel and call beyondgrad.runtime.ensure_cpu_devices({n_devices}) before any JAX computation",
        )
    )
    try:
        x = jnp.linspace(0.0, 1.0, 5)
        jitted = float(jax.jit(lambda v: jnp.sum(jnp.sin(v)))(x))
        grad = jax.grad(lambda v: jnp.sum(v**3))(x)
        ok = abs(jitted - float(jnp.sum(jnp.sin(x)))) < 1e-5 and bool(
            jnp.allclose(grad, 3 * x**2, rtol=1e-5)
        )
        checks.append(
            SetupCheck(
                "jit and grad",
                ok,
                "sin-sum under jit and d/dx x^3 match their closed forms",
                "reinstall JAX for this platform (see the JAX installation guide)",
            )
        )
    except Exception as e:  # report, do not stop the notebook
        checks.append(
            SetupCheck(
                "jit and grad",
                False,
                f"{type(e).__name__}: {e}",
                "reinstall JAX for this platform",
            )
        )
    if enough:
        try:
            mesh = demo_mesh(n_devices, "data")
            _smoke_shard_map(mesh)
            kind = mesh.devices.flat[0].platform
            checks.append(
                SetupCheck(
                    "shard_map",
                    True,
                    f"a psum over {mesh.size} {kind} devices matches one device",
                )
            )
        except Exception as e:
            checks.append(
                SetupCheck(
                    "shard_map",
                    False,
                    f"{type(e).__name__}: {e}",
                    "upgrade JAX; jax.shard_map needs the versions the book supports",
                )
            )
    else:
        checks.append(
            SetupCheck(
                "shard_map",
                False,
                "skipped: not enough devices",
                "fix the device check above first",
            )
        )
    return checks


# ----------------------------------------------------------------------------- version drift


@dataclasses.dataclass(frozen=True)
class DriftDifference:
    """One behaviour of the book that your JAX does differently from the book's JAX.

    ``str()`` names the chapter section, the probe and both outcomes.

    Attributes:
        probe_id: the drift probe's id.
        chapter: the page and section that teach the behaviour.
        book: the probe's outcome recorded for the book's JAX.
        yours: its outcome on the running JAX.
    """

    probe_id: str
    chapter: drift.ChapterRef
    book: drift.Outcome
    yours: drift.Outcome

    def __str__(self) -> str:
        return (
            f"- {self.chapter.doc} § {self.chapter.section}\n"
            f"    {drift.probe(self.probe_id).summary} [{self.probe_id}]\n"
            f"    book's JAX: {self.book.short()[:150]}\n"
            f"    your JAX:   {self.yours.short()[:150]}"
        )


@dataclasses.dataclass(frozen=True)
class DriftCheck:
    """The fast drift probes run on your JAX, compared with the book's recorded row.

    Made by :func:`check_my_jax`; ``str()`` summarises it, section by section.

    Attributes:
        jax_version: the JAX version the probes ran on.
        book_version: the recorded JAX version compared with.
        probes_run: the number of probes that ran.
        seconds: wall seconds from starting the probe process to its end.
        differences: the probes whose outcome differs from the recorded one (outcome
            kind, value or exception class), in the order of the probe list; probes
            with no recorded outcome are not compared.
        outcomes: every probe's outcome on your JAX, by probe id.
    """

    jax_version: str
    book_version: str
    probes_run: int
    seconds: float
    differences: tuple[DriftDifference, ...]
    outcomes: dict[str, drift.Outcome] = dataclasses.field(
        default_factory=dict, repr=False
    )

    @property
    def sections(self) -> list[str]:
        """The chapter sections that will behave differently, each once, in book order."""
        return list(dict.fromkeys(str(d.chapter) for d in self.differences))

    def __str__(self) -> str:
        head = (
            f"JAX {self.jax_version}: {self.probes_run} probes in {self.seconds:.0f} s "
            "(your machine, this run), "
            f"compared with the book's JAX {self.book_version}."
        )
        if not self.differences:
            return f"{head}\nNo chapter section will behave differently from the book's pages."
        lines = [
            head,
            f"{len(self.sections)} chapter section(s) will behave differently:",
        ]
        return "\n".join([*lines, *map(str, self.differences)])


def check_my_jax(book_version: str | None = None, timeout: float = 60.0) -> DriftCheck:
    """Run the fast drift probes on the installed JAX; list where the book's pages differ.

    The probes run in a fresh Python process (they need 8 CPU devices, which a kernel
    whose JAX has started cannot create), each probe in its own forked process.
    ``book_version`` is the recorded JAX to compare with (default: the newest, which the
    book is built with). Compares outcome kind, value and exception class; messages and
    line numbers move between releases without changing what a chapter shows.

    Args:
        book_version: A recorded JAX version to compare with; the newest recorded
            when ``None``.
        timeout: Seconds the probe process may run, a number ``> 0``.

    Returns:
        A :class:`DriftCheck`: the probes run, their outcomes, and the differences
        from the recorded row, each with the chapter section it affects.

    Raises:
        RuntimeError: No drift results are recorded, or the probes could not run.
        ValueError: ``book_version`` is not a recorded version, or ``timeout`` is not
            ``> 0``.
        TypeError: ``timeout`` is not a number.
    """
    import json
    import time

    recorded = drift.versions()
    if book_version is None:
        if not recorded:
            raise RuntimeError(
                "no drift results are recorded: run `python3 dev.py drift`"
            )
        book_version = recorded[-1]
    if not isinstance(book_version, str) or book_version not in recorded:
        raise ValueError(
            f"book_version must be one of the recorded versions {recorded}, "
            f"got {book_version!r}"
        )
    _checks.number(timeout, "timeout", above=0, meaning="seconds")
    t0 = time.perf_counter()
    stdout = _fast_probe_output(timeout)
    seconds = time.perf_counter() - t0
    version, diffs, n, outcomes = jax.__version__, [], 0, {}
    for line in stdout.splitlines():
        rec = json.loads(line)
        if "env" in rec:
            version = rec["env"]["jax"]
            continue
        n += 1
        yours = outcomes[rec["id"]] = drift.Outcome.from_dict(rec["outcome"])
        book = drift.outcome(rec["id"], book_version)
        if book is not None and not book.same_behaviour(yours, exact=False):
            diffs.append(
                DriftDifference(rec["id"], drift.chapter(rec["id"]), book, yours)
            )
    order = {p: k for k, p in enumerate(drift.probe_ids())}
    diffs.sort(key=lambda d: order[d.probe_id])
    return DriftCheck(version, book_version, n, seconds, tuple(diffs), outcomes)


def _fast_probe_output(timeout: float) -> str:
    """Run the fast drift probes in a fresh Python process; return its JSON lines."""
    import subprocess
    from pathlib import Path

    pkg_parent = str(Path(drift.__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [pkg_parent, env.get("PYTHONPATH", "")])
    )
    env.pop("XLA_FLAGS", None)
    jobs = str(max(1, min(4, os.cpu_count() or 1)))  # Colab's CPU runtime has 2 cores
    cmd = [
        sys.executable,
        "-m",
        "beyondgrad.drift.child",
        "--fast",
        "--jobs",
        jobs,
        "--timeout",
        str(timeout),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout * len(drift.probe_ids()) + 60,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"the drift probes could not run: {tail[0]}")
    return proc.stdout

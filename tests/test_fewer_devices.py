"""Chapters on a runtime whose default backend has fewer than 8 devices (issue 41).

A Colab GPU runtime has one GPU, a small TPU runtime one core: every mesh of the book
must then come from :func:`beyondgrad.runtime.demo_mesh`, which falls back to the 8 CPU
devices the setup cell asks for. Here, on a CPU-only machine, such a runtime is
simulated inside the kernel: JAX's device queries without a backend argument
(``jax.devices()``, ``jax.device_count()``, which ``jax.make_mesh`` reads) see only the
first CPU device, while ``jax.devices("cpu")`` sees all 8. A mesh built on the default
devices then fails as it would on one GPU (``ValueError: Number of devices 1 must be
>= ...``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import book

#: The first cell of the kernel: one default device, 8 CPU devices.
ONE_DEFAULT_DEVICE = """\
import jax
from jax._src import xla_bridge as _xb

_all_devices, _all_count = _xb.devices, _xb.device_count


def _devices(backend=None):
    found = _all_devices(backend)
    return found[:1] if backend is None else found


def _device_count(backend=None):
    return 1 if backend is None else _all_count(backend)


_xb.devices = jax.devices = _devices
_xb.device_count = jax.device_count = _device_count
"""

CHAPTER_6 = book.ROOT / "chapters" / "06_sharded_vmc.ipynb"

#: What in a chapter's code asks about devices or lays arrays out on them.
USES_DEVICES = re.compile(
    r"demo_mesh|make_mesh|jax\.devices|device_count|shard_map|NamedSharding|Mesh\("
)


def chapters_that_use_devices() -> list[Path]:
    """The chapter notebooks whose code uses devices (the others cannot see how many
    there are)."""
    import nbformat

    from tools.executed import code_of

    found = []
    for source in book.chapter_sources():
        path = source.with_suffix(".ipynb")
        code = "\n".join(code_of(nbformat.read(path, as_version=4)))
        if USES_DEVICES.search(code):
            found.append(path)
    return found


def run_with_one_default_device(path: Path):
    """Execute the notebook at ``path`` (Run all, first error stops it) after
    :data:`ONE_DEFAULT_DEVICE`; return the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(ONE_DEFAULT_DEVICE))
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return nb


def test_the_simulation_gives_one_default_device_and_8_cpu_devices(tmp_path):
    import nbformat

    probe = nbformat.v4.new_notebook()
    probe.cells = [
        nbformat.v4.new_code_cell(
            "from beyondgrad import runtime\n"
            "runtime.ensure_cpu_devices(8)\n"
            "import jax\n"
            "print(len(jax.devices()), jax.device_count(), len(jax.devices('cpu')))\n"
            "try:\n"
            "    jax.make_mesh((8,), ('data',))\n"
            "except ValueError as e:\n"
            "    print('make_mesh:', e)\n"
            "print('demo_mesh:', runtime.demo_mesh(8, 'data').devices.size)"
        )
    ]
    path = tmp_path / "probe.ipynb"
    nbformat.write(probe, path)
    nb = run_with_one_default_device(path)
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert text.startswith("1 1 8\n"), text
    assert "make_mesh: Number of devices 1 must be >=" in text, text
    assert "demo_mesh: 8" in text


def one_default_device_run_cached(path: Path):
    """:func:`run_with_one_default_device`, kept in this environment's test cache
    until the notebook's code, the package or a version changes (the rule of
    ``tools.execute.run_all_cached``): a warm run of the same commit does not execute
    the chapter again, an edited chapter or package does."""
    import nbformat

    from tools.executed import code_of, is_fresh, test_cache, write_atomically

    candidate = test_cache() / "one_default_device" / path.name
    if candidate.exists():
        kept = nbformat.read(candidate, as_version=4)
        # the kept run has the simulation cell first; the rest is the notebook's code
        same = lambda: code_of(kept)[1:] == code_of(nbformat.read(path, as_version=4))  # noqa: E731
        if code_of(kept)[:1] == [ONE_DEFAULT_DEVICE] and is_fresh(
            candidate, [path], same
        ):
            return kept
    nb = run_with_one_default_device(path)
    write_atomically(nb, candidate)
    return nb


def test_the_chapters_with_devices_include_the_sharding_chapters():
    names = [p.name for p in chapters_that_use_devices()]
    for chapter in ("04_shard_map_vma", "05_laplacians", "06_sharded_vmc"):
        assert f"{chapter}.ipynb" in names, names


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", chapters_that_use_devices(), ids=lambda p: p.stem)
def test_chapter_runs_with_one_default_device(path):
    nb = one_default_device_run_cached(path)
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, errors[0]


def test_chapters_build_meshes_only_through_demo_mesh():
    """A mesh on the default devices fails where the default backend has fewer than
    8 devices; chapters build their meshes with runtime.demo_mesh (a cell that shows
    jax.make_mesh itself passes it the devices)."""
    for source in book.chapter_sources():
        nb = book._read_chapter(source)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            for line in cell.source.splitlines():
                code = line.split("#")[0]
                if re.search(r"\bmake_mesh\(", code) and "devices=" not in cell.source:
                    raise AssertionError(
                        f"{source.name}: {line.strip()!r} builds a mesh on the default "
                        "devices; use runtime.demo_mesh"
                    )

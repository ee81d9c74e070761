"""Importing the package has no side effects: no backend starts, no install needed."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(
    code: str, *, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "src")
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _submodules() -> list[str]:
    pkg = ROOT / "src" / "beyondgrad"
    names = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def test_every_submodule_imports_without_starting_a_backend():
    mods = _submodules()
    assert len(mods) >= 10, mods
    code = (
        "import importlib\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "from beyondgrad import compat, runtime\n"
        "assert not compat.backends_initialized(), 'an import started a JAX backend'\n"
        "print('devices', runtime.ensure_cpu_devices(8))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "devices 8" in out.stdout


def test_import_from_a_plain_checkout_reports_the_pyproject_floor():
    """No install metadata needed: the floor comes from pyproject.toml itself."""
    floor = None
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]:
        if dep.replace(" ", "").startswith("jax>="):
            floor = dep.replace(" ", "").removeprefix("jax>=")
    assert floor is not None
    # A copy of src/ and pyproject.toml in a temporary folder: nothing installed there.
    code = "import beyondgrad, sys; print(beyondgrad.JAX_FLOOR)"
    out = _run(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == floor


def test_floor_pins_every_direct_dependency_at_its_lower_bound():
    import dev

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = [*project["dependencies"], *project["optional-dependencies"]["chapters"]]
    pins = dev.floor_pins()
    assert len(pins) == len(direct) + 1  # and jaxlib, at jax's floor
    for dep, pin in zip(direct, pins, strict=False):
        name, bound = dep.split(">=")
        assert pin == f"{name}=={bound}"
    assert pins[-1] == f"jaxlib=={dev.jax_floor()}"
    assert set(dev.dependency_names()) >= {"jax", "jaxlib", "numpy", "folx"}


def test_floor_environment_has_the_lowest_allowed_versions():
    """Under `dev.py --jax floor test` (CI's floor run): what is installed is the floor."""
    import os
    from importlib.metadata import version

    from packaging.version import Version

    if os.environ.get("BEYONDGRAD_JAX") != "floor":
        import pytest

        pytest.skip(
            "not the floor environment (dev.py --jax floor sets BEYONDGRAD_JAX)"
        )
    import dev

    for pin in dev.floor_pins():
        name, want = pin.split("==")
        assert Version(version(name)) == Version(want), (name, version(name), want)


def test_api_pages_list_every_public_module():
    """Each public module (a module of the package with ``__all__``) is documented once,
    on its page: api.md for the modules a reader imports, internals.md for the book's
    apparatus and compat. Each page is autosummary's table of its modules, then one
    ``automodule`` with ``:members:`` per module, which autodoc fills from ``__all__``."""
    import re

    from tools import api

    pages = {p: p.read_text() for p in (api.PAGE, api.INTERNALS)}
    modules = api.public_modules()
    assert {
        "beyondgrad.sharding",
        "beyondgrad.linear",
        "beyondgrad.slater",
        "beyondgrad.vmc",
    } <= {m for m in modules if api.page_of(m) == api.PAGE}
    assert {
        "beyondgrad.compat",
        "beyondgrad.drift",
        "beyondgrad.exercises.ch1",
        "beyondgrad.figures.ch3",
    } <= {m for m in modules if api.page_of(m) == api.INTERNALS}
    assert api.READER_MODULES <= set(modules)
    for page, text in pages.items():
        table = text.split(".. autosummary::", 1)[1].split("```", 1)[0]
        listed = re.findall(r"^   (beyondgrad[\w.]*)$", table, re.M)
        documented = re.findall(r"^\.\. automodule:: (\S+)\n   :members:\n", text, re.M)
        want = [m for m in modules if api.page_of(m) == page]
        assert listed == want, f"{page.name}: autosummary lists {listed}, want {want}"
        assert documented == want, f"{page.name}: automodule for {documented}"
        for module in want:
            assert f"## `{module}`\n" in text, f"{page.name}: no heading for {module}"


def test_every_public_name_is_documented():
    """autodoc (``automodule`` with ``:members:``) shows a module's public name only if it
    is documented: a function or class by its docstring, data by a ``#:`` comment on
    its assignment (or a docstring after it). An undocumented name in ``__all__`` would
    be left off the API pages without a warning."""
    import importlib
    import inspect

    from sphinx.pycode import ModuleAnalyzer

    from tools import api

    missing = []
    for module in api.public_modules():
        mod = importlib.import_module(module)
        comments = ModuleAnalyzer.for_module(module).find_attr_docs()
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or not getattr(
                obj, "__module__", "beyondgrad"
            ).startswith("beyondgrad"):
                continue  # re-exported from JAX (compat): JAX's to document
            if inspect.isclass(obj) or inspect.isfunction(inspect.unwrap(obj)):
                documented = bool((obj.__doc__ or "").strip())
            else:  # data, type aliases
                documented = ("", name) in comments
            if name.startswith("__") and name.endswith("__"):  # autodoc skips these
                page = api.page_of(module).read_text()  # unless the page names them
                section = page.split(f".. automodule:: {module}\n", 1)[1]
                options = section.split("```", 1)[0]
                documented &= f":special-members: {name}" in options
            if not documented:
                missing.append(f"{module}.{name}")
    assert not missing, f"public names autodoc would leave off: {missing}"


def test_every_mutant_of_the_mutation_check_still_applies(tmp_path):
    """tools/mutate.py: each deliberate bug's text is in its file exactly once (a stale
    mutant would be reported, not run: update it when the code moves)."""
    import shutil

    from tools import mutate

    shutil.copytree(mutate.PACKAGE, tmp_path / "beyondgrad")
    stale = {m.id: mutate.apply(m, tmp_path) for m in mutate.MUTANTS}
    assert {k: v for k, v in stale.items() if v is not None} == {}
    assert len({m.id for m in mutate.MUTANTS}) == len(mutate.MUTANTS) >= 15


def test_names_used_finds_a_chapters_helpers_and_nothing_else():
    """The chapter → API links (tools.api.names_used, used by _ext/book_ext.py)."""
    from tools import api

    text = (
        "from beyondgrad import drift, tracers as tr\n"
        "from beyondgrad.exercises import ch1 as ex1\n"
        "tr.format_table(rows)\n"
        "x = drift.table(['p']); drift.table([])\n"
        "tr.not_a_public_name(1)\n"  # not in tracers.__all__
        "other.format_table\n"  # not a beyondgrad alias
        "ex1.check_fix_jit(f)\n"
    )
    assert api.names_used(text) == [
        "beyondgrad.tracers.format_table",
        "beyondgrad.drift.table",
        "beyondgrad.exercises.ch1.check_fix_jit",
    ]
    assert api.names_used("import jax\njax.grad(f)\n") == []


def test_every_chapter_links_only_names_on_the_api_pages():
    from tools import api

    page = api.PAGE.read_text() + api.INTERNALS.read_text()
    for chapter in sorted((ROOT / "chapters").glob("*.md")):
        used = api.names_used(chapter.read_text())
        assert used, f"{chapter.name} calls no beyondgrad helper?"
        for dotted in used:
            module, name = dotted.rsplit(".", 1)
            assert f".. automodule:: {module}\n   :members:" in page, chapter.name
            assert name in api.static_public_names(module), f"{chapter.name}: {dotted}"

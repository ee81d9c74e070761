#!/usr/bin/env python3
"""Set up, build and test Beyond grad. Needs only Python 3.11+.

    python3 dev.py book        # install into .venv if needed, build the executed book
                               # (_build/html), then check every page in Chromium
    python3 dev.py test        # install into .venv if needed, run the test suite
    python3 dev.py sync        # regenerate the notebooks (chapters/*.ipynb, notebooks/student/)
    python3 dev.py lint        # ruff check + ruff format --check
    python3 dev.py typecheck   # mypy and pyright over src/beyondgrad (pyproject.toml)
    python3 dev.py mutate      # tools/mutate.py: deliberate bugs the tests must catch
    python3 dev.py chapter chapters/01_tracers.md   # execute one chapter, report errors and time
    python3 dev.py page chapters/01_tracers.md      # build only that chapter as a book, with -W
    python3 dev.py drift [--versions ...]  # probes under every JAX of tools/drift.py (drift.md)
    python3 dev.py matrix [--points ...]   # every notebook, Run all, under every minor JAX
                               # release supported (tools/matrix.py; the Tested-on table)
    python3 dev.py draws --points P --seeds 0:500   # each checker on its own solution,
                               # seed by seed, into records/checker_draws.jsonl (tools/draws.py)

Options (before the command): --venv DIR (default .venv, or $BEYONDGRAD_VENV),
--jax VERSION|floor|lock|newest (default newest, or $BEYONDGRAD_JAX; newest: uv.lock's
versions, upgraded past the lock on CI; lock: uv.lock's versions exactly, also on CI
(what the README gives a newcomer); floor: every direct dependency of pyproject.toml at
its lower bound, the toolchain at uv.lock's versions), --force (book: re-execute every notebook, ignoring
the cache), --upgrade (newest: upgrade jax, jaxlib, folx and numpy past the lock to
their newest releases; always on when CI=true, so CI's newest environment really is
the newest).
Environments are installed by uv (installed with pip when not on PATH) from uv.lock
(`uv sync --locked`; the toolchain is pyproject.toml's `dev` dependency group): after
editing pyproject.toml's requirements run `uv lock` and commit uv.lock.
Re-running is fast: the environment is reinstalled only when uv.lock or
pyproject.toml change.
Each JAX environment builds into its own folder (_build for the newest JAX,
_build-floor/_build for the floor).

Caches kept between runs on this machine, outside the checkout (so a fresh clone, as
on CI, finds them), under $BEYONDGRAD_CACHE (default ~/.cache/beyondgrad):
  book-<key>/  executed chapters (the book build's jupyter-cache, and the chapters and
               notebooks the tests execute); <key> digests every installed distribution
               and its version, the Python version and the package's sources
               (src/beyondgrad), and jupyter-cache matches each chapter on its code
               cells: a chapter re-executes only when its code, the package or a
               version changed, and a page never shows outputs from another package
               or JAX. A new key rebuilds the pages (never a stale page).
  jax-<key>/   JAX's persistent compilation cache for the test suite (tests/conftest.py
               enables it; tests that log or count compilations opt out); <key>
               digests the Python version and the jax* distributions' versions. Chapters run
               without it: what they show of compilation never depends on a cache.
  mypy/        mypy's incremental cache (`typecheck`); mypy re-checks what changed.
A clean machine builds the same book and passes the same tests, only slower.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

if sys.version_info < (3, 11):  # noqa: UP036 (a clear message on an old Python)
    sys.exit(f"Python 3.11+ is needed, this is {sys.version.split()[0]}")

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import tomllib  # noqa: E402  (3.11+, checked above)

from tools.book import jax_floor  # noqa: E402  (stdlib only)

#: What the newest environment upgrades (--upgrade, and always on CI).
UPGRADED = ("jax", "jaxlib", "folx", "numpy")
#: What `dev.py lint` checks with ruff (configured in pyproject.toml, 88 columns).
LINTED = ("src", "tests", "tools", "benchmarks", "_ext", "dev.py")
#: Bumped when the way environments are installed changes: every environment refreshes.
INSTALLER = "uv-2"


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def build_dir(jax_spec: str) -> Path:
    """The build folder of an environment: ``_build`` (newest), ``_build-<spec>/_build`` (others)."""
    return (
        ROOT / "_build"
        if jax_spec == "newest"
        else ROOT / f"_build-{jax_spec}" / "_build"
    )


#: Environment variables naming the two caches to the tools and the tests.
EXEC_CACHE_VARIABLE = "BEYONDGRAD_EXEC_CACHE"
JAX_CACHE_VARIABLE = "BEYONDGRAD_JAX_CACHE"
#: Cache folders unused for this many days are removed (each run touches its own).
CACHE_DAYS = 14


def cache_root() -> Path:
    """Where the caches live, outside any checkout: ``$BEYONDGRAD_CACHE``, else
    ``$XDG_CACHE_HOME/beyondgrad``, else ``~/.cache/beyondgrad``."""
    named = os.environ.get("BEYONDGRAD_CACHE", "").strip()
    if named:
        return Path(named).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "beyondgrad"


_FREEZE = (
    "import importlib.metadata as m, platform\n"
    "rows = sorted({(d.metadata['Name'] or '').lower(): d.version\n"
    "               for d in m.distributions()}.items())\n"
    "print('Python', platform.python_version(), platform.machine())\n"
    "print('\\n'.join(f'{n}=={v}' for n, v in rows if n != 'beyondgrad'))\n"
)


def environment_freeze(py: Path) -> str:
    """Every distribution installed in the environment of ``py`` with its version, and
    the Python version: what the caches are keyed on besides the package's sources."""
    return subprocess.run(
        [str(py), "-c", _FREEZE], capture_output=True, text=True, check=True
    ).stdout


def package_digest() -> str:
    """A digest of the package's sources and data (``src/beyondgrad``, every file but
    compiled bytecode): what the chapters import."""
    h = hashlib.sha256()
    base = ROOT / "src" / "beyondgrad"
    for path in sorted(base.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(base).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


#: jax, jaxlib and JAX's device plugins (jax-cuda12-plugin, ...), in a freeze line.
_JAX_DIST = re.compile(r"(jax|jaxlib|jax[-_](cuda|rocm|tpu)[\w.-]*)==")


def caches(py: Path) -> dict[str, Path]:
    """This environment's two caches (created; see the module docstring), by variable:
    executed chapters keyed on versions + package sources, compilations on versions."""
    freeze = environment_freeze(py)
    # compilations depend on Python, jax, jaxlib (and any jax plugin) alone; JAX's own
    # cache key adds the program, the compile options and the devices
    lines = freeze.splitlines()
    jax_only = "\n".join([lines[0], *(ln for ln in lines if _JAX_DIST.match(ln))])
    digest = hashlib.sha256(jax_only.encode()).hexdigest()
    book = hashlib.sha256(f"{freeze}\n{package_digest()}".encode()).hexdigest()
    root = cache_root()
    found = {
        EXEC_CACHE_VARIABLE: root / f"book-{book[:16]}",
        JAX_CACHE_VARIABLE: root / f"jax-{digest[:16]}",
    }
    for folder, keyed_on in zip(found.values(), (freeze, jax_only)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "key.txt").write_text(keyed_on)  # what it is keyed on; marks it used
    _prune_caches(root, keep=set(found.values()))
    return found


def _prune_caches(root: Path, keep: set[Path]) -> None:
    """Remove cache folders not used for :data:`CACHE_DAYS` days."""
    cutoff = time.time() - CACHE_DAYS * 86400
    for folder in root.glob("*-*"):
        key = folder / "key.txt"
        if folder in keep or not key.exists() or key.stat().st_mtime >= cutoff:
            continue
        shutil.rmtree(folder, ignore_errors=True)


def link_execution_cache(build: Path, exec_cache: Path) -> None:
    """Make ``build/.jupyter_cache`` (where Jupyter Book keeps executed notebooks) and
    ``build/test_execute`` (tools/execute.py's) the keyed cache's. When the key differs from the one this build folder was made with,
    the folder's pages, doctrees and executed copies are removed first: Sphinx re-reads
    a page only when its source changed, and a page must never keep outputs computed
    with another package or another JAX."""
    build.mkdir(parents=True, exist_ok=True)
    stamp = build / ".beyondgrad-exec-cache"
    fresh = stamp.exists() and stamp.read_text() == str(exec_cache)
    if not fresh:
        for sub in ("html", "jupyter_execute", ".doctrees"):
            shutil.rmtree(build / sub, ignore_errors=True)
    # the book build's jupyter-cache, and what tools/execute.py keeps for the tests
    for name in (".jupyter_cache", "test_execute"):
        link, target = build / name, exec_cache / name
        target.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        new = build / f"{name}.link"
        new.unlink(missing_ok=True)
        try:
            new.symlink_to(target, target_is_directory=True)
        except OSError:  # no symbolic links here: a private copy, emptied on a new key
            if not fresh or link.is_symlink():
                _remove(link)
            link.mkdir(exist_ok=True)
            continue
        _remove(link)
        new.rename(link)
    stamp.write_text(str(exec_cache))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def direct_dependencies() -> list[str]:
    """The package's own requirements: ``dependencies`` plus the ``chapters`` extra."""
    project = _pyproject()["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["chapters"]]


def dependency_names() -> tuple[str, ...]:
    """jax, jaxlib, then every other direct dependency: what each command reports."""
    names = [
        re.split(r"[<>=!~ \[;]", d.strip(), maxsplit=1)[0].lower()
        for d in direct_dependencies()
    ]
    return tuple(dict.fromkeys(["jax", "jaxlib", *names]))


def floor_pins() -> list[str]:
    """``name==X`` for every direct dependency's ``name>=X`` (and jaxlib == jax's floor):
    what the floor environment must hold. uv installs it (``--resolution
    lowest-direct``); :func:`ensure_env` then checks each of these, so a lower bound
    that uv had to move up (it cannot be installed with the others) fails the install
    instead of passing unnoticed; raise that bound in pyproject.toml.
    """
    pins = []
    for dep in direct_dependencies():
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", dep.strip())
        if m is None:
            raise SystemExit(
                f"pyproject.toml: dependency {dep!r} has no plain 'name>=X' lower bound; "
                "the floor environment needs one per direct dependency"
            )
        pins.append(f"{m.group(1)}=={m.group(2)}")
    return [*pins, f"jaxlib=={jax_floor()}"]


def jax_requirements(spec: str) -> list[str]:
    """What is installed besides the lock: nothing (newest: uv.lock's jax, upgraded on
    CI), jaxlib at jax's floor (floor; the rest at their lower bounds by uv's
    ``lowest-direct``), or jax and jaxlib at a chosen version."""
    if spec in ("newest", "lock"):
        return []
    if spec == "floor":
        return [f"jaxlib=={jax_floor()}"]
    return [f"jax=={spec}", f"jaxlib=={spec}"]


def venv_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def uv_command(py: Path) -> list[str]:
    """uv (https://docs.astral.sh/uv/), which installs and resolves: the one on PATH, else
    installed with pip into the environment itself (a fresh machine needs only Python)."""
    found = shutil.which("uv")
    if found:
        return [found]
    uv = py.parent / ("uv.exe" if os.name == "nt" else "uv")
    if not uv.exists():
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "uv"], check=True)
    return [str(uv)]


def _quiet() -> list[str]:
    return [] if on_ci() else ["--quiet"]


def uv_pip(py: Path, *args: str) -> None:
    """``uv pip ARGS`` into the environment of ``py`` (stops dev.py on failure)."""
    cmd = [*uv_command(py), "pip", *args, "--python", str(py)]
    subprocess.run([*cmd, *_quiet()], check=True)


def uv_sync(env: Path, py: Path) -> None:
    """``uv sync --locked`` into ``env``: uv.lock's toolchain (the ``dev`` group), this
    package with its ``chapters`` extra (editable) and their locked dependencies.
    ``--inexact`` keeps pip and uv (dev.py's installer) and what ``--jax`` adds."""
    cmd = [*uv_command(py), "sync", "--project", str(ROOT), "--locked", "--inexact"]
    cmd += ["--extra", "chapters", "--python", str(py), *_quiet()]
    subprocess.run(
        cmd, check=True, env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(env)}
    )


def locked_toolchain(py: Path) -> list[str]:
    """uv.lock's ``dev`` group with every package it needs, as ``name==X[ ; marker]``,
    less the package's direct dependencies and jaxlib (the floor chooses those)."""
    out = subprocess.run(
        [*uv_command(py), "export", "--project", str(ROOT), "--locked"]
        + ["--only-group", "dev", "--no-emit-project", "--no-hashes", "--no-header"]
        + ["--no-annotate", "--quiet"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    floor_chosen = set(dependency_names())
    pins = []
    for line in out.splitlines():
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9_.-]*)==", line)
        if m and re.sub(r"[-_.]+", "-", m.group(1).lower()) not in floor_chosen:
            pins.append(line)
    return pins


def install_floor(env: Path, py: Path) -> None:
    """Every direct dependency at its lowest allowed version (``--resolution
    lowest-direct``, as folx's CI does), jaxlib at jax's floor, and the toolchain at
    uv.lock's versions; then check that each lower bound is what got installed."""
    toolchain = env / ".beyondgrad-toolchain.txt"
    toolchain.write_text("\n".join(locked_toolchain(py)) + "\n")
    uv_pip(
        py,
        "install",
        "--resolution",
        "lowest-direct",
        "-r",
        str(toolchain),
        "-e",
        f"{ROOT}[chapters]",
        *jax_requirements("floor"),
    )
    # packaging's comparison (2.0.0 is 2.0), in the environment (the toolchain has it)
    code = (
        "import importlib.metadata as m, sys; from packaging.version import Version\n"
        "for pin in sys.argv[1:]:\n"
        "    name, want = pin.split('==')\n"
        "    got = m.version(name)\n"
        "    if Version(got) != Version(want):\n"
        "        print(f'{name} {got} (lower bound {want})')\n"
    )
    moved = subprocess.run(
        [str(py), "-c", code, *floor_pins()], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    if moved:
        raise SystemExit(
            f"[dev] the floor environment {env} is not at the lower bounds: "
            f"{', '.join(moved)}; raise those bounds in pyproject.toml"
        )


def ensure_env(env: Path, jax_spec: str) -> Path:
    """Create/refresh the virtual environment; skip when nothing it depends on changed.

    The environment is a standard venv (``venv`` from the standard library) that uv
    installs into. newest and ``X.Y.Z``: ``uv sync --locked`` (uv.lock: the ``dev``
    toolchain, this package with its ``chapters`` extra, editable), then jax/jaxlib
    ``X.Y.Z``. floor: :func:`install_floor`.
    """
    reqs = jax_requirements(jax_spec)
    # The venv keeps the Python it was created with; the stamp covers what is installed into it.
    stamp_text = "\n".join(
        [
            INSTALLER,
            jax_spec,
            *reqs,
            (ROOT / "uv.lock").read_text(),
            (ROOT / "pyproject.toml").read_text(),
        ]
    )
    stamp = hashlib.sha256(stamp_text.encode()).hexdigest()
    stamp_file = env / ".beyondgrad-stamp"
    py = venv_python(env)
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return py
    t0 = time.perf_counter()
    what = (
        "each direct dependency at its lower bound"
        if jax_spec == "floor"
        else (", ".join(["uv.lock", *reqs]))
    )
    print(f"[dev] installing into {env} ({what}) ...", flush=True)
    if not py.exists():
        venv.create(env, with_pip=True, clear=True)
    try:
        if jax_spec == "floor":
            install_floor(env, py)
        else:
            uv_sync(env, py)
            if reqs:
                uv_pip(py, "install", *reqs)
    except subprocess.CalledProcessError:
        hint = (
            "uv.lock must match pyproject.toml: after editing pyproject.toml run "
            f"`{uv_command(py)[0]} lock` and commit uv.lock; otherwise see uv's message"
        )
        if jax_spec == "floor":
            hint += (
                " (floor: a lower bound that cannot be installed with the others or "
                "with the locked toolchain: raise the bound uv names)"
            )
        raise SystemExit(f"[dev] cannot install into {env}: {hint}") from None
    stamp_file.write_text(stamp)
    print(f"[dev] environment ready in {time.perf_counter() - t0:.0f} s", flush=True)
    return py


def upgrade_newest(py: Path) -> None:
    """Upgrade jax, jaxlib, folx and numpy to their newest releases (uv's resolver decides)."""
    t0 = time.perf_counter()
    print(
        f"[dev] upgrading {', '.join(UPGRADED)} to the newest releases ...", flush=True
    )
    # --refresh-package: ask the index again, not uv's cached page of it.
    refresh = [arg for name in UPGRADED for arg in ("--refresh-package", name)]
    uv_pip(py, "install", "--upgrade", *refresh, *UPGRADED)
    print(f"[dev] upgraded in {time.perf_counter() - t0:.0f} s", flush=True)


_VERSIONS = (
    "import importlib.metadata as m, platform\n"
    "names = {names!r}\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return 'not installed'\n"
    "print(', '.join(f'{{n}} {{v(n)}}' for n in names) + f', Python {{platform.python_version()}}')\n"
)


def resolved_versions(py: Path) -> str:
    """``jax X, jaxlib Y, numpy Z, folx W, ..., Python V``: every direct dependency as
    installed in the environment."""
    code = _VERSIONS.format(names=dependency_names())
    return subprocess.run(
        [str(py), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def run_env(
    build: Path | None = None,
    jax_spec: str | None = None,
    cache: dict[str, Path] | None = None,
) -> dict[str, str]:
    env = dict(os.environ)
    for variable, folder in (
        cache or {}
    ).items():  # caches(): tools and tests read them
        env[variable] = str(folder)
    if jax_spec is not None:  # tests check the floor environment against pyproject.toml
        env["BEYONDGRAD_JAX"] = jax_spec
    if (
        build is not None
    ):  # tools.book.build_dir(): caches of executed notebooks live here
        env["BEYONDGRAD_BUILD_DIR"] = str(build)
    # Several notebooks may share one GPU during a build: allocate on demand.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # This checkout's src/ first: a worktree or a plain clone runs its own package,
    # whatever the virtual environment has installed.
    paths = [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return env


def cmd_book(
    py: Path, force: bool, build: Path, cache: dict[str, Path] | None = None
) -> int:
    """Build the executed book into ``build`` with -W, then check every page in Chromium.

    Chapters come from the keyed execution cache (:func:`caches`) when their code cells
    match; ``force`` empties it first, so every chapter executes."""
    cache = cache or {}
    if force:
        for sub in ("html", ".jupyter_cache", "jupyter_execute", ".doctrees"):
            path = build / sub
            if path.is_symlink():
                path.unlink()
            shutil.rmtree(path, ignore_errors=True)
        if EXEC_CACHE_VARIABLE in cache:
            shutil.rmtree(cache[EXEC_CACHE_VARIABLE] / ".jupyter_cache", True)
    if EXEC_CACHE_VARIABLE in cache:
        link_execution_cache(build, cache[EXEC_CACHE_VARIABLE])
    t0 = time.perf_counter()
    # Nothing runs beside the build: the chapters' measured timings are published.
    book_cmd = [
        str(py.parent / "jupyter-book"),
        "build",
        str(ROOT),
        "--path-output",
        str(build.parent),
    ]
    rc = subprocess.run(
        [*book_cmd, "-W", "-n", "--keep-going"], env=run_env(build, cache=cache)
    ).returncode
    html = build / "html"
    print(
        f"[dev] book build exited {rc} after {time.perf_counter() - t0:.0f} s; open {html}/index.html"
    )
    if rc != 0:
        return rc
    t0 = time.perf_counter()
    rc = subprocess.run(
        [str(py), "-m", "tools.browser", str(html)],
        cwd=ROOT,
        env=run_env(build, cache=cache),
    ).returncode
    print(f"[dev] browser checks exited {rc} after {time.perf_counter() - t0:.0f} s")
    return rc


def cmd_page(
    py: Path, paths: list[str], build: Path, cache: dict[str, Path] | None = None
) -> int:
    """Build a small book of the given chapters only (for authors): same config, -W."""
    if not paths:
        sys.exit("dev.py page needs chapter files, e.g. chapters/01_tracers.md")
    stems = [Path(p).with_suffix("").as_posix() for p in paths]
    out = build / "pages" / "-".join(Path(s).name for s in stems)
    out.mkdir(parents=True, exist_ok=True)
    toc = out / "_toc.yml"
    # The first page is the root, so the intro (which links every chapter) stays out;
    # links from these pages to chapters outside the selection still warn.
    rest = [
        p
        for p in dict.fromkeys([*stems[1:], "glossary", "status", "api", "internals"])
        if p != stems[0]
    ]
    entries = "\n".join(f"      - file: {s}" for s in rest)
    toc.write_text(
        f"format: jb-book\nroot: {stems[0]}\nparts:\n  - caption: Pages\n    chapters:\n{entries}\n"
    )
    cmd = [
        str(py.parent / "jupyter-book"),
        "build",
        str(ROOT),
        "--toc",
        str(toc),
        "--path-output",
        str(out),
    ]
    if cache and EXEC_CACHE_VARIABLE in cache:  # the book's executions serve here too
        link_execution_cache(out / "_build", cache[EXEC_CACHE_VARIABLE])
    rc = subprocess.run(
        [*cmd, "-W", "-n", "--keep-going"], env=run_env(out / "_build", cache=cache)
    ).returncode
    print(f"[dev] page build exited {rc}; open {out}/_build/html/index.html")
    return rc


def cmd_lint(py: Path) -> int:
    """ruff check and ruff format --check over the package, tests, tools and benchmarks."""
    paths = [p for p in LINTED if (ROOT / p).exists()]
    ruff = [str(py), "-m", "ruff"]
    rc = subprocess.run([*ruff, "check", *paths], cwd=ROOT).returncode
    fmt = subprocess.run([*ruff, "format", "--check", *paths], cwd=ROOT).returncode
    if fmt:
        print(
            f"[dev] ruff format would reformat files: run `{py} -m ruff format {' '.join(paths)}`"
        )
    return rc or fmt


def cmd_typecheck(py: Path) -> int:
    """mypy, then pyright, over src/beyondgrad (both configured in pyproject.toml) with
    this environment's JAX; either one's findings fail the command. mypy keeps its
    incremental cache with the other caches (:func:`cache_root`): it re-checks a module
    whose content changed, so a kept cache only saves time."""
    env = {**os.environ, "MYPY_CACHE_DIR": str(cache_root() / "mypy")}
    rc = subprocess.run([str(py), "-m", "mypy"], cwd=ROOT, env=env).returncode
    if rc:
        print(
            "[dev] mypy found type errors in src/ (config: pyproject.toml [tool.mypy])"
        )
    pyright = [str(py), "-m", "pyright", "--pythonpath", str(py)]
    prc = subprocess.run(pyright, cwd=ROOT).returncode
    if prc:
        print(
            "[dev] pyright found type errors in src/ (config: pyproject.toml "
            "[tool.pyright])"
        )
    return rc or prc


#: How the whole suite runs: one pytest worker per core (pytest-xdist), and a worker
#: that finishes early takes queued tests from the others (the student notebooks and the
#: benchmark checks run tens of seconds each, most tests well under one).
#: ``--durations`` prints the 30 slowest test phases, so a CI log says where its time went.
PARALLEL = ["-n", "auto", "--dist", "worksteal", "--durations=30"]


def cmd_test(
    py: Path,
    pytest_args: list[str],
    build: Path,
    jax_spec: str = "newest",
    cache: dict[str, Path] | None = None,
) -> int:
    """Run pytest: the whole suite in parallel (``PARALLEL``), or exactly what
    ``pytest_args`` select, in one process."""
    args = pytest_args or PARALLEL
    if cache and EXEC_CACHE_VARIABLE in cache:
        link_execution_cache(build, cache[EXEC_CACHE_VARIABLE])
    rc = subprocess.run(
        [str(py), "-m", "pytest", *args],
        cwd=ROOT,
        env=run_env(build, jax_spec, cache),
    ).returncode
    if rc == 5:  # pytest: no tests collected (e.g. a -k filter matched nothing)
        print("[dev] pytest collected no tests")
    return rc


def cmd_chapter(
    py: Path, paths: list[str], build: Path, cache: dict[str, Path] | None = None
) -> int:
    code = "import sys; from tools.execute import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [str(py), "-c", code, *paths], cwd=ROOT, env=run_env(build, cache=cache)
    ).returncode


COMMANDS = [
    "book", "test", "sync", "lint", "typecheck", "mutate", "chapter", "page", "setup"
]  # fmt: skip


def main(argv: list[str]) -> int:
    # Commands that need no environment of their own dispatch before one is built.
    if argv[:1] == ["drift"]:  # maintainers: probes under many JAX versions, own venvs
        from tools.drift import main as drift_main

        return drift_main(argv[1:])
    if argv[:1] == ["matrix"]:  # every notebook under every minor JAX, own venvs
        from tools.matrix import main as matrix_main

        return matrix_main(argv[1:])
    if argv[:1] == ["draws"]:  # the checker-draws ledger, in the matrix's venvs
        from tools.draws import main as draws_main

        return draws_main(argv[1:])
    if argv[:1] == ["mutate"] and "--list" in argv:  # the table only: stdlib
        from tools.mutate import main as mutate_main

        return mutate_main(argv[1:])
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--venv",
        default=os.environ.get("BEYONDGRAD_VENV", str(ROOT / ".venv")),
        help="virtual environment",
    )
    ap.add_argument(
        "--jax",
        default=os.environ.get("BEYONDGRAD_JAX", "newest"),
        help="newest (default), lock, floor, or X.Y.Z",
    )
    ap.add_argument(
        "--force", action="store_true", help="book: re-execute every notebook"
    )
    ap.add_argument(
        "--upgrade",
        action="store_true",
        help="newest: upgrade jax, jaxlib, folx, numpy (on CI always)",
    )
    ap.add_argument("command", choices=COMMANDS)
    ap.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        help="pytest arguments (test) or chapter files (chapter)",
    )
    ns = ap.parse_args(argv)
    py = ensure_env(Path(ns.venv).resolve(), ns.jax)
    if ns.jax == "newest" and (ns.upgrade or on_ci()):
        upgrade_newest(py)
    print(f"[dev] {ns.jax} environment {ns.venv}: {resolved_versions(py)}", flush=True)
    build = build_dir(ns.jax)
    cache = caches(py) if ns.command != "setup" else {}
    if cache:  # every command reads and writes executed chapters in the keyed cache
        link_execution_cache(build, cache[EXEC_CACHE_VARIABLE])
    if ns.command == "book":
        return cmd_book(py, ns.force, build, cache)
    if ns.command == "test":
        return cmd_test(py, ns.args, build, ns.jax, cache)
    if ns.command == "sync":  # the notebooks, and requirements.txt from uv.lock
        env = run_env(build, cache=cache)
        env["PATH"] = os.pathsep.join([str(py.parent), env.get("PATH", "")])
        rc = subprocess.run([str(py), "-m", "tools.requirements"], cwd=ROOT, env=env)
        if rc.returncode:
            return rc.returncode
        return subprocess.run(
            [str(py), "-m", "tools.book"], cwd=ROOT, env=env
        ).returncode
    if ns.command == "lint":
        return cmd_lint(py)
    if ns.command == "typecheck":
        return cmd_typecheck(py)
    if ns.command == "mutate":  # tools/mutate.py: deliberate bugs the tests must catch
        cmd = [str(py), "-m", "tools.mutate", "--python", str(py), *ns.args]
        return subprocess.run(cmd, cwd=ROOT, env=run_env(build, cache=cache)).returncode
    if ns.command == "chapter":
        return cmd_chapter(py, ns.args, build, cache)
    if ns.command == "page":
        return cmd_page(py, ns.args, build, cache)
    return 0  # setup: environment only


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

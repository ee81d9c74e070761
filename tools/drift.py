"""Run the version-drift probes under every JAX version of VERSIONS (maintainers).

    python3 dev.py drift                      # every missing (probe, version) cell
    python3 dev.py drift --versions 0.8.1     # only these versions (X.Y.Z[@PYTHON])
    python3 dev.py drift --probes ID,ID --force   # re-run these cells

One virtual environment per version in ``.venv-drift/<version>`` (ignored by git),
created on demand by uv with the Python that version needs (pyenv) and reused. An existing
environment that already holds exactly that JAX may be reused read-only instead
(``BEYONDGRAD_DRIFT_REUSE=dir1:dir2``, plus this checkout's ``.venv*``): nothing is
installed into it. Each probe runs in a fresh process (see beyondgrad.drift.child);
results merge into ``src/beyondgrad/drift/results.json`` with the versions, platform
and date of the run. Only cells that are missing run, unless ``--force``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "src" / "beyondgrad" / "drift" / "results.json"
ENVS = ROOT / ".venv-drift"

sys.path.insert(0, str(ROOT / "src"))  # the probes module is stdlib-only at import
from beyondgrad.drift.probes import FOLX_OLD, FOLX_OLD_ENV  # noqa: E402

#: The JAX versions of the report and the Python each runs on: THE list, kept here only.
#: Every release from 0.5.3 (before the varying types: jax#28260 "worked on 0.5.3") to
#: the newest, so that each version boundary the book states is exact: the first
#: release with the new behaviour, not the first one recorded. 0.8.2 is the book's
#: floor; 0.11.0 and later need Python 3.12.
VERSIONS: dict[str, str] = {
    v: ("3.12.1" if v.startswith(("0.11.", "0.12.")) else "3.11.7")
    for v in (
        "0.5.3", "0.6.0", "0.6.1", "0.6.2", "0.7.0", "0.7.1", "0.7.2",
        "0.8.0", "0.8.1", "0.8.2", "0.8.3",
        "0.9.0", "0.9.0.1", "0.9.1", "0.9.2",
        "0.10.0", "0.10.1", "0.10.2",
        "0.11.0", "0.11.1", "0.11.2",
        "0.12.0", "0.12.0.1",
    )
}  # fmt: skip
DEFAULT_PYTHON = "3.11.7"
PROBE_TIMEOUT_S = 120.0
_lock = threading.Lock()
_uv_lock = threading.Lock()  # versions install in threads: uv itself is installed once


def say(msg: str) -> None:
    with _lock:
        print(f"[drift] {msg}", flush=True)


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def parse_versions(spec: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """``"0.8.1,0.9.0@3.11.7"`` -> ([(version, python)], [one-line problems])."""
    if not spec:
        return list(VERSIONS.items()), []
    out, problems = [], []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        version, _, python = item.partition("@")
        if not re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", version):
            problems.append(
                f"unknown version {item!r}: expected a JAX release like 0.8.2 "
                f"(optionally @PYTHON, e.g. 0.8.2@3.11.7); known: {', '.join(VERSIONS)}"
            )
            continue
        if python and not re.fullmatch(r"3\.\d+\.\d+", python):
            problems.append(f"bad Python {python!r} in {item!r}: expected e.g. 3.11.7")
            continue
        out.append((version, python or VERSIONS.get(version, DEFAULT_PYTHON)))
    return out, problems


def _installed_jax(env: Path) -> str | None:
    """The jax version installed in a venv, read from its dist-info (no Python run)."""
    for info in env.glob("lib/python3*/site-packages/jax-*.dist-info"):
        m = re.fullmatch(r"jax-(.+)\.dist-info", info.name)
        if m:
            return m.group(1)
    return None


def _reusable(version: str) -> Path | None:
    dirs = [
        Path(d)
        for d in os.environ.get("BEYONDGRAD_DRIFT_REUSE", "").split(os.pathsep)
        if d
    ]
    dirs += sorted(
        p for p in ROOT.glob(".venv*") if p.is_dir() and p.name != ".venv-drift"
    )
    for env in dirs:
        if (env / "bin" / "python").exists() and _installed_jax(env) == version:
            return env
    return None


def interpreter(python: str) -> tuple[str | None, str]:
    """The executable of Python ``python`` (pyenv, else pythonX.Y on PATH), or why not."""
    if shutil.which("pyenv"):
        pre = subprocess.run(
            ["pyenv", "prefix", python], capture_output=True, text=True
        )
        if pre.returncode != 0:
            return None, f"Python {python} is not installed (pyenv install {python})"
        return str(Path(pre.stdout.strip()) / "bin" / "python3"), ""
    minor = ".".join(python.split(".")[:2])
    exe = shutil.which(f"python{minor}")
    if exe is None:
        return None, f"Python {python} not found (no pyenv, no python{minor} on PATH)"
    return exe, ""


def uv() -> str:
    """uv (https://docs.astral.sh/uv/): the one on PATH, else installed once with pip
    into ``.venv-drift/_uv`` (this runner needs only Python)."""
    found = shutil.which("uv")
    if found:
        return found
    tool = ENVS / "_uv"
    exe = tool / "bin" / "uv"
    with _uv_lock:  # another thread may be writing exe: wait for it to finish
        if not exe.exists():
            subprocess.run([sys.executable, "-m", "venv", str(tool)], check=True)
            pip = [str(tool / "bin" / "python"), "-m", "pip", "install", "-q"]
            subprocess.run([*pip, "--disable-pip-version-check", "uv"], check=True)
    return str(exe)


def _uv_install(py: Path, *reqs: str) -> subprocess.CompletedProcess:
    cmd = [uv(), "pip", "install", "--quiet", "--python", str(py), *reqs]
    return subprocess.run(cmd, capture_output=True, text=True)


def _why_not(version: str, python: str, err: str) -> str:
    """One line from uv's resolver message."""
    needs = re.search(
        rf"jax=={re.escape(version)} depends on Python([<>=!~][^\s,]+)", err
    )
    if needs:
        return (
            f"jax {version} needs Python {needs.group(1)}, not {python}: "
            f"ask for {version}@<newer python>"
        )
    if (
        f"no version of jax=={version}" in err
        or f"no version of jaxlib=={version}" in err
    ):
        return f"the package index has no jax=={version} (for Python {python})"
    lines = [line.strip() for line in err.strip().splitlines() if line.strip()]
    return f"uv failed for jax=={version}: {(lines or [''])[-1][:200]}"


def ensure_env(version: str, python: str) -> tuple[Path | None, str]:
    """The venv's python for this version (created if needed), or None and why not.

    uv creates the venv with the interpreter that version needs (pyenv or PATH) and
    installs jax/jaxlib, then the newest folx that keeps that JAX.
    """
    env = ENVS / version
    if (env / ".drift-ready").exists():
        return env / "bin" / "python", f"{env.relative_to(ROOT)}"
    reuse = _reusable(version)
    if reuse is not None:
        return reuse / "bin" / "python", f"{reuse} (reused read-only)"
    exe, why = interpreter(python)
    if exe is None:
        return None, why
    say(f"{version}: creating {env.relative_to(ROOT)} with Python {python} ...")
    t0 = time.perf_counter()
    shutil.rmtree(env, ignore_errors=True)
    made = subprocess.run(
        [uv(), "venv", "--quiet", "--python", exe, str(env)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        tail = made.stderr.strip()[-200:]
        return None, f"cannot create a venv with Python {python}: {tail}"
    py = env / "bin" / "python"
    got = _uv_install(py, f"jax=={version}", f"jaxlib=={version}")
    if got.returncode != 0:
        shutil.rmtree(env, ignore_errors=True)
        return None, _why_not(version, python, got.stderr)
    # folx is optional: the newest folx that installs without changing this JAX.
    folx = _uv_install(py, "folx", f"jax=={version}", f"jaxlib=={version}")
    note = (
        ""
        if folx.returncode == 0
        else " (folx does not install: its probe is 'unavailable')"
    )
    (env / ".drift-ready").write_text(f"jax=={version}\n")
    say(f"{version}: environment ready in {time.perf_counter() - t0:.0f} s{note}")
    return py, f"{env.relative_to(ROOT)}"


def load_results() -> dict:
    if RESULTS.is_file():
        return json.loads(RESULTS.read_text())
    return {"schema": 1, "versions": {}, "probes": {}, "results": {}}


def save_results(data: dict) -> None:
    from beyondgrad.drift.probes import PROBES

    data["probes"] = {
        p.id: {
            "summary": p.summary,
            "fast": p.fast,
            "chapter": {"doc": p.chapter.doc, "section": p.chapter.section},
        }
        for p in PROBES.values()
    }
    data["versions"] = dict(
        sorted(data["versions"].items(), key=lambda kv: version_key(kv[0]))
    )
    data["results"] = {
        pid: dict(
            sorted(
                data["results"].get(pid, {}).items(), key=lambda kv: version_key(kv[0])
            )
        )
        for pid in PROBES
        if pid in data["results"]
    }
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(RESULTS)


def ensure_folx_old(py: Path, version: str) -> Path | None:
    """folx FOLX_OLD in its own directory (never into a reused venv); None if it fails."""
    target = ENVS / version / "folx-old"
    if (target / ".ready").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    got = subprocess.run(
        [
            uv(),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(py),
            "--no-deps",
            "--target",
            str(target),
            f"folx=={FOLX_OLD}",
        ],
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        say(f"{version}: folx {FOLX_OLD} does not install; its probe is 'unavailable'")
        return None
    (target / ".ready").write_text(FOLX_OLD + "\n")
    return target


def run_version(
    py: Path, version: str, ids: list[str], data: dict, timeout: float
) -> int:
    """Run ``ids`` on one version; merge outcomes into ``data`` as they arrive."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    if "seed000_folx_old_slogdet_grad" in ids:
        old = ensure_folx_old(py, version)
        if old is not None:
            env[FOLX_OLD_ENV] = str(old)
    cmd = [str(py), "-m", "beyondgrad.drift.child", "--timeout", str(timeout), *ids]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    done = 0
    for line in proc.stdout:
        rec = json.loads(line)
        if "env" in rec:
            if rec["env"]["jax"] != version:
                proc.kill()
                say(
                    f"{version}: the environment {py} has jax {rec['env']['jax']}, skipped"
                )
                return 0
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            with _lock:
                data["versions"][version] = {
                    **rec["env"],
                    "date": stamp,
                    "cores": os.cpu_count(),
                }
            continue
        with _lock:
            data["results"].setdefault(rec["id"], {})[version] = rec["outcome"]
            save_results(data)
        done += 1
    err = proc.stderr.read()
    if proc.wait() != 0:
        say(
            f"{version}: runner exited {proc.returncode}: {err.strip().splitlines()[-1:] or ''}"
        )
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="dev.py drift",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--versions", help="comma-separated X.Y.Z[@PYTHON] (default: the VERSIONS list)"
    )
    ap.add_argument("--probes", help="comma-separated probe ids (default: all)")
    ap.add_argument(
        "--force", action="store_true", help="re-run cells that already have results"
    )
    ap.add_argument(
        "--jobs", type=int, default=2, help="versions run at once (default 2)"
    )
    ap.add_argument(
        "--timeout", type=float, default=PROBE_TIMEOUT_S, help="seconds per probe"
    )
    ns = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from beyondgrad.drift.probes import PROBES

    t0 = time.perf_counter()
    targets, problems = parse_versions(ns.versions)
    for p in problems:
        say(p)
    ids = list(PROBES)
    if ns.probes:
        ids = [s.strip() for s in ns.probes.split(",") if s.strip()]
        bad = [i for i in ids if i not in PROBES]
        if bad:
            say(f"unknown probe id(s) {', '.join(bad)}; known: {', '.join(PROBES)}")
            ids = [i for i in ids if i in PROBES]
    data = load_results()
    failures = len(problems)

    def one(version: str, python: str) -> None:
        nonlocal failures
        todo = [i for i in ids if ns.force or version not in data["results"].get(i, {})]
        if not todo:
            say(f"{version}: all {len(ids)} probes already recorded")
            return
        py, where = ensure_env(version, python)
        if py is None:
            say(f"{version}: skipped: {where}")
            failures += 1
            return
        t1 = time.perf_counter()
        n = run_version(py, version, todo, data, ns.timeout)
        say(
            f"{version}: {n}/{len(todo)} probes in {time.perf_counter() - t1:.0f} s ({where})"
        )
        if n < len(todo):
            failures += 1

    with cf.ThreadPoolExecutor(max(1, ns.jobs)) as pool:
        for fut in [pool.submit(one, v, py) for v, py in targets]:
            fut.result()
    if targets:
        save_results(data)
    where = RESULTS.relative_to(ROOT) if RESULTS.is_relative_to(ROOT) else RESULTS
    say(f"done in {time.perf_counter() - t0:.0f} s; results in {where}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

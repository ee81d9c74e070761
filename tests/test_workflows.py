"""Hosted CI (.github/workflows), .ci/run and dev.py's CI behaviour.

The workflows cannot run here: they are parsed, and checked to call the README's
commands in the same environments as .ci/run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dev
from tools import book

# Checks CI's definition, dev.py and the README: the same on every JAX release (conftest.py).
pytestmark = pytest.mark.one_env

WORKFLOWS = book.ROOT / ".github" / "workflows"
CI_RUN = book.ROOT / ".ci" / "run"


def readme_commands() -> list[str]:
    """The commands of the README's "Set up, build, test" block."""
    text = (book.ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def workflow(name: str) -> dict:
    wf = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(wf, dict) and "jobs" in wf, f"{name} is not a workflow"
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    return wf


def run_lines(job: dict) -> list[str]:
    return [
        line.strip()
        for step in job["steps"]
        for line in step.get("run", "").splitlines()
    ]


def test_readme_commands_are_the_two_commands():
    assert readme_commands() == ["python3 dev.py book", "python3 dev.py test"]


def ci_environments() -> dict[str, dict]:
    """.ci/run's ENVIRONMENTS table: name -> python, venv, jax, suite, commands."""
    table = re.search(r"^ENVIRONMENTS='\n(.*?)^'", CI_RUN.read_text(), re.S | re.M)
    assert table, ".ci/run has no ENVIRONMENTS table"
    envs = {}
    for line in table.group(1).splitlines():
        if line.strip():
            name, python, venv, jax, suite, *commands = line.split()
            envs[name] = {
                "python": python,
                "venv": venv,
                "jax": jax,
                "suite": suite,
                "cmds": commands,
            }
    return envs


def test_ci_workflow_runs_each_environment_of_the_ci_script():
    wf = workflow("ci.yml")
    assert "pull_request" in wf["on"]
    (job,) = wf["jobs"].values()
    matrix = {(m["env"], m["python"]) for m in job["strategy"]["matrix"]["include"]}
    table = {(n, e["python"]) for n, e in ci_environments().items()}
    assert matrix == table  # one CI definition: the workflow runs .ci/run's table
    assert job["env"]["CI"] == "true"
    assert "bash .ci/run ${{ matrix.env }}" in run_lines(job)


def test_publish_workflow_builds_main_and_deploys_the_html():
    wf = workflow("publish.yml")
    assert wf["on"]["push"]["branches"] == ["main"]
    build = wf["jobs"]["build"]
    assert "python3 dev.py book" in run_lines(build)
    upload = [
        s
        for s in build["steps"]
        if s.get("uses", "").startswith("actions/upload-pages-artifact@")
    ]
    assert upload and upload[0]["with"]["path"] == "_build/html"
    deploy = wf["jobs"]["deploy"]
    assert deploy["needs"] == "build"
    assert any(
        s.get("uses", "").startswith("actions/deploy-pages@") for s in deploy["steps"]
    )
    assert (
        wf["permissions"]["pages"] == "write"
        and wf["permissions"]["id-token"] == "write"
    )


def test_ci_script_runs_the_readme_commands_in_three_environments():
    text = CI_RUN.read_text()
    subprocess.run(["bash", "-n", str(CI_RUN)], check=True)
    envs = ci_environments()
    readme = [c.removeprefix("python3 dev.py ") for c in readme_commands()]
    assert readme == ["book", "test"]
    assert envs["newest"]["python"] == "3.12" and envs["newest"]["jax"] == "newest"
    assert {"lint", "typecheck", "book", "test"} <= set(envs["newest"]["cmds"])
    assert envs["floor"]["python"] == "3.11" and envs["floor"]["jax"] == "floor"
    assert "test" in envs["floor"]["cmds"]
    # every test runs in newest; lock and floor leave out the one_env tests only
    assert envs["newest"]["suite"] == "all"
    assert {e["suite"] for e in envs.values()} <= {"all", "versions"}
    assert 'BEYONDGRAD_SUITE="$suite"' in text
    # what the README gives a newcomer whose python3 is 3.11: uv.lock, not upgraded
    assert envs["lock"]["python"] == "3.11" and envs["lock"]["jax"] == "lock"
    assert {"book", "test"} <= set(envs["lock"]["cmds"])  # both README commands
    for env in envs.values():
        assert env["cmds"][0] == "setup"
    assert len({e["venv"] for e in envs.values()}) == len(envs)
    assert "export CI=true" in text


def test_ci_script_refuses_an_unknown_environment():
    out = subprocess.run(
        ["bash", str(CI_RUN), "nosuchenv"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "unknown environment 'nosuchenv'" in out.stdout


def test_requirements_txt_is_uv_lock_exported():
    from tools import requirements

    assert requirements.PATH.exists(), (
        "requirements.txt is missing: python3 dev.py sync"
    )
    assert requirements.PATH.read_text() == requirements.exported(), (
        "requirements.txt is not uv.lock's export: run python3 dev.py sync"
    )


def test_environments_build_into_separate_folders():
    assert dev.build_dir("newest") == book.ROOT / "_build"
    assert dev.build_dir("floor") == book.ROOT / "_build-floor" / "_build"
    assert dev.build_dir("0.9.0") != dev.build_dir("floor")


def test_build_folder_reaches_the_tools(monkeypatch):
    env = dev.run_env(dev.build_dir("floor"))
    monkeypatch.setenv(book.BUILD_DIR_VARIABLE, env[book.BUILD_DIR_VARIABLE])
    assert book.build_dir() == book.ROOT / "_build-floor" / "_build"
    from tools import execute

    assert execute.test_cache().is_relative_to(book.ROOT / "_build-floor")
    monkeypatch.delenv(book.BUILD_DIR_VARIABLE)
    assert book.build_dir() == book.ROOT / "_build"


def _calls(monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        return subprocess.CompletedProcess(
            cmd, 0, stdout="jax 9, jaxlib 9, folx 1, numpy 3, Python 3.12\n"
        )

    monkeypatch.setattr(dev.subprocess, "run", run)
    monkeypatch.setattr(dev, "ensure_env", lambda env, spec: Path("/venv/bin/python"))
    return calls


@pytest.mark.parametrize(
    "ci, jax, upgraded",
    [
        ("true", "newest", True),
        ("", "newest", False),
        ("true", "floor", False),
        ("true", "lock", False),
    ],
    ids=["ci-newest", "local-newest", "ci-floor", "ci-lock"],
)
def test_newest_is_upgraded_on_ci(monkeypatch, ci, jax, upgraded):
    monkeypatch.setenv("CI", ci)
    calls = _calls(monkeypatch)
    assert dev.main(["--jax", jax, "setup"]) == 0
    pip_upgrades = [
        c for c in calls if c[1:3] == ["pip", "install"] and "--upgrade" in c
    ]
    if upgraded:
        assert pip_upgrades and set(dev.UPGRADED) <= set(pip_upgrades[0])
    else:
        assert pip_upgrades == []


def test_every_command_prints_the_resolved_versions(monkeypatch, capsys):
    monkeypatch.delenv("CI", raising=False)
    _calls(monkeypatch)
    dev.main(["--jax", "newest", "setup"])
    assert "[dev] newest environment" in capsys.readouterr().out


def test_resolved_versions_of_this_environment():
    import sys

    import jax

    text = dev.resolved_versions(Path(sys.executable))
    assert (
        text.startswith(f"jax {jax.__version__}, jaxlib ")
        and ", folx " in text
        and ", numpy " in text
    )


def test_lint_covers_the_code(monkeypatch):
    calls = _calls(monkeypatch)
    assert dev.cmd_lint(Path("/venv/bin/python")) == 0
    check, fmt = calls
    assert check[1:4] == ["-m", "ruff", "check"] and fmt[1:5] == [
        "-m",
        "ruff",
        "format",
        "--check",
    ]
    assert {"src", "tests", "tools", "benchmarks", "dev.py"} <= set(check) & set(fmt)


@pytest.mark.parametrize("rc", [0, 1, 5])
def test_whole_suite_runs_in_parallel_workers(monkeypatch, rc):
    calls: list[list[str]] = []

    def run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        return subprocess.CompletedProcess(cmd, rc)

    monkeypatch.setattr(dev.subprocess, "run", run)
    py = Path("/venv/bin/python")
    assert dev.cmd_test(py, [], dev.build_dir("newest")) == rc
    assert calls == [[str(py), "-m", "pytest", *dev.PARALLEL]]
    assert dev.PARALLEL[:4] == ["-n", "auto", "--dist", "worksteal"]


def test_xdist_is_a_requirement():
    """``-n auto`` needs pytest-xdist: the README's setup installs it (pyproject.toml's
    ``dev`` group, locked in uv.lock)."""
    import tomllib

    project = tomllib.loads((book.ROOT / "pyproject.toml").read_text())
    assert any(
        d.startswith("pytest-xdist") for d in project["dependency-groups"]["dev"]
    )
    assert 'name = "pytest-xdist"' in (book.ROOT / "uv.lock").read_text()


def test_selected_tests_run_alone(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(
        dev.subprocess,
        "run",
        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0),
    )
    assert (
        dev.cmd_test(Path("/py"), ["tests/test_book.py"], dev.build_dir("newest")) == 0
    )
    assert len(calls) == 1 and "-n" not in calls[0]


def test_caches_live_outside_the_checkout_keyed_on_versions_and_package(
    tmp_path, monkeypatch
):
    import sys

    monkeypatch.setenv("BEYONDGRAD_CACHE", str(tmp_path))
    py = Path(sys.executable)
    first = dev.caches(py)
    assert set(first) == {dev.EXEC_CACHE_VARIABLE, dev.JAX_CACHE_VARIABLE}
    for folder in first.values():
        assert folder.parent == tmp_path and not folder.is_relative_to(book.ROOT)
    # executed chapters: keyed on every installed version and the Python version
    keyed_on = (first[dev.EXEC_CACHE_VARIABLE] / "key.txt").read_text()
    assert "jax==" in keyed_on and "numpy==" in keyed_on and "Python" in keyed_on
    # compilations: on Python, jax and jaxlib
    keyed_on = (first[dev.JAX_CACHE_VARIABLE] / "key.txt").read_text()
    assert "jaxlib==" in keyed_on and "numpy==" not in keyed_on
    monkeypatch.setattr(dev, "package_digest", lambda: "another package")
    second = dev.caches(py)
    # another package source: other executed chapters, the same compilations
    assert second[dev.EXEC_CACHE_VARIABLE] != first[dev.EXEC_CACHE_VARIABLE]
    assert second[dev.JAX_CACHE_VARIABLE] == first[dev.JAX_CACHE_VARIABLE]


def test_package_digest_covers_every_source_file(tmp_path, monkeypatch):
    package = tmp_path / "src" / "beyondgrad"
    package.mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    before = dev.package_digest()
    (package / "a.py").write_text("x = 2\n")
    assert dev.package_digest() != before


def test_a_new_cache_key_removes_the_pages_built_with_the_old(tmp_path):
    build = tmp_path / "_build"
    (build / "html").mkdir(parents=True)
    dev.link_execution_cache(build, tmp_path / "key-a")
    assert not (build / "html").exists()  # no record of its key: rebuilt
    assert (build / ".jupyter_cache").resolve() == (
        tmp_path / "key-a" / ".jupyter_cache"
    ).resolve()
    assert (build / "test_execute").resolve() == (
        tmp_path / "key-a" / "test_execute"
    ).resolve()
    (build / "html").mkdir()
    dev.link_execution_cache(build, tmp_path / "key-a")
    assert (build / "html").exists()  # same key: the pages stay
    dev.link_execution_cache(build, tmp_path / "key-b")
    assert not (build / "html").exists()
    assert (build / ".jupyter_cache").resolve() == (
        tmp_path / "key-b" / ".jupyter_cache"
    ).resolve()


def test_ci_does_not_force_the_book(monkeypatch):
    """The chapters' cache is keyed on code, package and versions: CI reuses it."""
    monkeypatch.setenv("CI", "true")
    _calls(monkeypatch)
    forced = []
    monkeypatch.setattr(dev, "caches", lambda py: {})
    monkeypatch.setattr(
        dev, "cmd_book", lambda py, force, build, cache: forced.append(force) or 0
    )
    assert dev.main(["--jax", "floor", "book"]) == 0
    assert forced == [False]


def _logs_compilations():
    from beyondgrad import tracers

    with tracers.jax_log("jax_log_compiles") as messages:
        pass
    return messages


def test_tests_that_observe_compilation_run_without_the_compile_cache():
    """tests/conftest.py turns JAX's persistent cache off for a test whose source
    names what logs or counts compilations (its messages would depend on the cache)."""
    import conftest

    class Item:
        def __init__(self, function, marker=None):
            self.function, self.marker = function, marker

        def get_closest_marker(self, name):
            return self.marker if name == "no_compile_cache" else None

    assert conftest._observes_compilation(Item(_logs_compilations))
    assert not conftest._observes_compilation(Item(test_ci_does_not_force_the_book))
    marked = Item(test_ci_does_not_force_the_book, marker=object())
    assert conftest._observes_compilation(marked)


def test_floor_takes_the_locked_toolchain_but_not_the_direct_dependencies(monkeypatch):
    """The floor installs uv.lock's toolchain pins except the direct dependencies and
    jaxlib, which ``--resolution lowest-direct`` puts at their lower bounds."""
    exported = "\n".join(
        [
            "ruff==0.17.6",
            "numpy==2.4.6 ; python_full_version < '3.12'",
            "jaxlib==0.12.0.1",
            "ipywidgets==8.1.9",
            "scipy==1.17.1 ; python_full_version < '3.12'",
            "    # via pytest",
        ]
    )
    monkeypatch.setattr(dev, "uv_command", lambda py: ["uv"])
    monkeypatch.setattr(
        dev.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, stdout=exported),
    )
    assert dev.locked_toolchain(Path("/py")) == [
        "ruff==0.17.6",
        "scipy==1.17.1 ; python_full_version < '3.12'",
    ]


def _collected(suite: str, *paths: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BEYONDGRAD_SUITE": suite}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
         "-p", "no:cacheprovider", *paths],
        cwd=book.ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip


def test_the_versions_suite_leaves_out_exactly_the_one_env_tests():
    """CI's lock and floor run BEYONDGRAD_SUITE=versions: every test but those marked
    one_env (a whole file here, one test of another file); a wrong name is refused."""
    paths = ("tests/test_matrix.py", "tests/test_exercises.py")
    ids = {}
    for suite in ("all", "versions"):
        out = _collected(suite, *paths)
        assert out.returncode == 0, out.stdout + out.stderr
        ids[suite] = {line for line in out.stdout.splitlines() if "::" in line}
    left_out = ids["all"] - ids["versions"]
    assert ids["versions"] < ids["all"]
    assert any("test_a_python_loop_that_never_ends" in t for t in left_out), left_out
    assert all(
        t.startswith("tests/test_matrix.py::") or "never_ends" in t for t in left_out
    ), left_out
    bad = _collected("some", "tests/test_matrix.py")
    assert bad.returncode != 0
    assert (
        "BEYONDGRAD_SUITE='some': use one of all, versions" in bad.stdout + bad.stderr
    )

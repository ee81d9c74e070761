"""The version matrix (tools/matrix.py, `python3 dev.py matrix`) and its record on the
"Tested on" page."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tools import book, draws, matrix

# Checks the version-matrix tool and its record: the same on every JAX release (conftest.py).
pytestmark = pytest.mark.one_env


def _locked_jax() -> set[str]:
    text = (book.ROOT / "uv.lock").read_text()
    return set(re.findall(r'\nname = "jax"\nversion = "([^"]+)"', text))


def test_points_cover_the_floor_the_lock_and_every_minor_release_between():
    names = {p.name for p in matrix.MATRIX}
    assert "floor@3.11" in names
    locked = _locked_jax()  # one per Python marker: 3.11's and 3.12's resolution
    assert locked and all(
        f"{v}@3.11" in names or f"{v}@3.12" in names for v in locked
    ), f"uv.lock's JAX {sorted(locked)} must be matrix points"
    minors = {tuple(p.jax.split(".")[:2]) for p in matrix.MATRIX if p.jax != "floor"}
    floor_minor = tuple(book.jax_floor().split(".")[:2])
    newest_minor = max(tuple(int(x) for x in m) for m in minors)
    for minor in range(int(floor_minor[1]) + 1, newest_minor[1] + 1):
        assert ("0", str(minor)) in minors, f"no point for JAX 0.{minor}.x"
    assert len(names) == len(matrix.MATRIX)


def test_every_notebook_is_in_the_matrix():
    found = {p.relative_to(book.ROOT).as_posix() for p in matrix.notebooks()}
    for source in book.chapter_sources():
        assert f"chapters/{source.stem}.ipynb" in found
    assert any(n.startswith("notebooks/student/") for n in found)


def _record(status: str) -> dict:
    entry = {"notebook": "chapters/01_x.ipynb", "seconds": 12.3, "status": status}
    entry["error"] = (
        ""
        if status == "ok"
        else "01_x.ipynb: Run all stopped at cell 7 (code cell 3 of 9) with "
        "AssertionError: flops | 145920\n    assert ..."
    )
    versions = {"jax": "0.10.2", "python": "3.11.7", "numpy": "2", "folx": "0.2"}
    return {
        "date": "2026-11-28",
        "commit": "abc1234",
        "machine": "2 CPU cores, CPU only",
        "points": [
            {"point": "0.10.2@3.11", "versions": versions, "notebooks": [entry]}
        ],
    }


def test_render_names_the_first_failing_cell_and_its_error():
    ok = matrix.render(_record("ok"))
    assert "✓ 12 s" in ok and "JAX 0.10.2, Python 3.11" in ok and "abc1234" in ok
    bad = matrix.render(_record("stopped"))
    assert "✗ cell 7 (code cell 3 of 9) with AssertionError: flops \\| 145920" in bad
    assert "assert ..." not in bad  # one line per cell: the table stays a table


def test_tested_on_shows_the_committed_record():
    page = matrix.PAGE.read_text()
    assert matrix.START in page and matrix.END in page
    if not matrix.RECORD.exists():
        pytest.skip("no matrix record committed yet")
    record = json.loads(matrix.RECORD.read_text())
    shown = page.split(matrix.START, 1)[1].split(matrix.END, 1)[0].strip()
    assert shown == matrix.render(record).strip(), (
        "tested_on.md's matrix table is not records/matrix.json's: "
        "python3 -c 'import json; from tools import matrix; "
        "matrix.write_page(json.loads(matrix.RECORD.read_text()))'"
    )


def test_a_partial_rerun_replaces_only_its_entries_and_is_marked(tmp_path, monkeypatch):
    base = _record("ok")
    point = base["points"][0]
    point["notebooks"].append(
        {
            "notebook": "chapters/06_y.ipynb",
            "seconds": 50.0,
            "status": "ok",
            "error": "",
        }
    )
    point["checker_draws"] = {"draws": 5, "returncode": 0, "summary": "15 passed"}
    record = tmp_path / "matrix.json"
    record.write_text(json.dumps(base))
    monkeypatch.setattr(matrix, "RECORD", record)
    monkeypatch.setattr(matrix, "git_commit", lambda: "def5678")
    rerun = {"notebook": "chapters/06_y.ipynb", "seconds": 61.0, "status": "ok"}
    draw = {"draws": 5, "select": "6_1", "returncode": 0, "summary": "1 passed"}
    where = matrix.Point("0.10.2", "3.11", "")
    merged = matrix.merge(where, point["versions"], [dict(rerun, error="")], draw)
    by_name = {e["notebook"]: e for e in merged["notebooks"]}
    assert by_name["chapters/01_x.ipynb"] == point["notebooks"][0]  # kept as it was
    assert by_name["chapters/06_y.ipynb"]["commit"] == "def5678"
    assert merged["checker_draws"] == point["checker_draws"]
    assert merged["checker_reruns"][0]["select"] == "6_1"
    page = matrix.render({**base, "points": [merged]})
    assert "✓ 12 s |" in page and "✓ 61 s †" in page
    assert "`-k 6_1`, 5 draws: 1 passed †" in page and "on commit `def5678`" in page
    with pytest.raises(SystemExit, match="environment changed"):
        matrix.merge(where, {**point["versions"], "jax": "0.10.1"}, [], None)


def test_a_rerun_of_a_notebook_the_full_run_lacked_joins_the_point(
    tmp_path, monkeypatch
):
    """A chapter added after a point's full run (chapter 3b, split from 3) is rerun
    with --notebooks: its entry is kept, in chapter order, not dropped."""
    base = _record("ok")
    point = base["points"][0]
    record = tmp_path / "matrix.json"
    record.write_text(json.dumps(base))
    monkeypatch.setattr(matrix, "RECORD", record)
    monkeypatch.setattr(matrix, "git_commit", lambda: "def5678")
    monkeypatch.setattr(
        matrix,
        "notebooks",
        lambda: [book.ROOT / "chapters" / n for n in ("00_a.ipynb", "01_x.ipynb")],
    )
    added = {"notebook": "chapters/00_a.ipynb", "seconds": 9.0, "status": "ok"}
    where = matrix.Point("0.10.2", "3.11", "")
    merged = matrix.merge(where, point["versions"], [dict(added, error="")], None)
    assert [e["notebook"] for e in merged["notebooks"]] == [
        "chapters/00_a.ipynb",
        "chapters/01_x.ipynb",
    ]
    assert merged["notebooks"][0]["commit"] == "def5678"
    assert merged["notebooks"][1] == point["notebooks"][0]


def test_the_record_has_every_notebook_at_every_point():
    """Tested on shows every self-study and student notebook at every point."""
    record = json.loads(matrix.RECORD.read_text())
    want = {p.relative_to(book.ROOT).as_posix() for p in matrix.notebooks()}
    for point in record["points"]:
        have = {e["notebook"] for e in point["notebooks"]}
        assert want <= have, f"{point['point']} lacks {sorted(want - have)}"


def test_a_rerun_cell_keeps_the_counts_and_drops_time_and_deselected():
    """The rerun row must fit the page at 1280 px (the browser check): pytest's
    summary keeps its pass/fail counts, not its deselected count or its time."""
    assert matrix._counts("2 passed, 13 deselected in 62.82s (0:01:02)") == "2 passed"
    assert (
        matrix._counts("1 failed, 13 passed, 1 deselected in 119.07s (0:01:59)")
        == "1 failed, 13 passed"
    )
    assert matrix._counts("1 passed") == "1 passed"


# --- the checker-draws ledger (tools/draws.py) -----------------------------------------


def test_the_ledger_knows_every_checker_of_the_draws_test():
    import test_exercises_draws as t

    assert draws.exercises() == list(t.CHECKERS)
    for name in t.CHECKERS:  # each has its files, so a changed checker resets its count
        assert draws.digest(name)


def _block(exercise: str, seeds: list[int], rejected=None, digest=None) -> dict:
    return {
        "point": "0.10.2@3.11",
        "exercise": exercise,
        "seeds": seeds,
        "rejected": rejected or {},
        "digest": digest or draws.digest(exercise),
        "date": "2026-11-29",
        "commit": "abc1234",
    }


def test_the_ledger_counts_distinct_seeds_at_todays_files_only():
    entries = [
        _block("5.1", [0, 50]),
        _block("5.1", [25, 100]),  # overlapping: counted once
        _block("5.1", [100, 900], digest="0" * 16),  # files changed since: not counted
        _block("2.1", [0, 50], rejected={"17": "x differs"}),
    ]
    t = draws.tally(entries)
    assert len(t[("0.10.2@3.11", "5.1")]["seeds"]) == 100
    assert sorted(t[("0.10.2@3.11", "2.1")]["bad"]) == [17]
    page = draws.render(entries)
    row = {ln.split(" | ")[0]: ln for ln in page.splitlines() if ln.startswith("| ")}
    assert "100 ✓" in row["| 5.1"] and "50 ✗ 1 rejected (seeds [17])" in row["| 2.1"]
    assert "| · |" in row["| 1.1"]


def test_tested_on_shows_the_ledger_at_todays_files():
    page = draws.PAGE.read_text()
    assert draws.START in page and draws.END in page
    shown = page.split(draws.START, 1)[1].split(draws.END, 1)[0].strip()
    assert shown == draws.render(draws.read()).strip(), (
        "tested_on.md's draws table is not the ledger's at today's files: "
        "python3 dev.py draws --render"
    )


@pytest.mark.parametrize("seeds", ["5", "9:3", "-1:4", "a:b"])
def test_draws_refuses_bad_seed_ranges(seeds):
    with pytest.raises(SystemExit, match="--seeds"):
        draws.main([f"--seeds={seeds}", "--render"])


def test_the_ledger_digest_ignores_comments_and_docstrings_not_code():
    base = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    reworded = 'def f(x):\n    """Another doc."""\n    # a comment\n    return x + 1\n'
    changed = 'def f(x):\n    """Doc."""\n    return x + 2\n'
    assert draws._code(base) == draws._code(reworded)
    assert draws._code(base) != draws._code(changed)


def test_each_point_keeps_its_own_compilation_cache_inside_the_checkout():
    one, other = (draws.compilation_cache(p.name) for p in matrix.MATRIX[:2])
    path = Path(one["JAX_COMPILATION_CACHE_DIR"])
    assert path.is_relative_to(draws.ROOT / ".cache")
    assert one["JAX_COMPILATION_CACHE_DIR"] != other["JAX_COMPILATION_CACHE_DIR"]
    assert float(one["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == 0
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(path / "x")], cwd=draws.ROOT
    )
    assert ignored.returncode == 0, "the cache must be ignored by git"


def test_src_staleness_ignores_only_python_files_whose_code_is_unchanged():
    assert matrix._same_code("src/beyondgrad/runtime.py", "HEAD")
    assert not matrix._same_code(
        "src/beyondgrad/figures/laplacian_benchmark.json", "HEAD"
    )
    assert not matrix._same_code("src/beyondgrad/no_such_module.py", "HEAD")
    first = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"],
        capture_output=True,
        text=True,
        cwd=draws.ROOT,
    ).stdout.split()[-1]
    assert not matrix._same_code("src/beyondgrad/sharded_vmc.py", first)


def test_the_digest_ignores_fields_a_newer_python_adds_empty():
    """3.12 gives FunctionDef a ``type_params=[]`` that 3.11 lacks: a ledger written
    under one Python must count under the other (CI tests on both)."""
    import ast

    tree = ast.parse("def f(x):\n    return x + 1\n")
    bare = draws._canonical(tree)
    tree.body[0].type_params = []  # what 3.12's parser adds
    assert draws._canonical(tree) == bare
    tree.body[0].body[0].value.right = ast.Constant(2)
    assert draws._canonical(tree) != bare

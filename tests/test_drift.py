"""The version-drift report: the honesty check against the installed JAX, the reader API,
the runner's handling of bad input and crashing probes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import drift_record  # tests/drift_record.py
import jax
import pytest

from beyondgrad import JAX_FLOOR, drift
from beyondgrad.drift import probes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def here():
    return drift_record.run_probes_here()


def test_honesty_installed_jax_matches_its_committed_row(here):
    """A new JAX that changes a behaviour fails here, naming the chapter to revisit."""
    meta, got = here
    version = meta["jax"]
    assert version == jax.__version__
    assert set(got) == set(drift.probe_ids())
    recorded = drift.versions()
    if version in recorded:
        row, exact = version, True
    else:
        newest = recorded[-1]
        assert drift.version_key(version) > drift.version_key(newest), (
            f"JAX {version} has no row in the drift report and is not newer than its newest "
            f"({newest}): run `python3 dev.py drift --versions {version}` and commit results.json"
        )
        print(
            f"JAX {version} has no row in the drift report; comparing with the newest, {newest}"
        )
        row, exact = newest, False
    diffs = []
    # The floor environment has the lowest allowed folx, the report's row the folx of
    # its run: probes that print the folx version compare the rest of their value.
    recorded_folx = drift.environment(row).get("folx", "")
    other_folx = meta.get("folx", "") != recorded_folx
    for pid, yours in got.items():
        book = drift.outcome(pid, row)
        if other_folx and book is not None:
            unversion = lambda o: dataclasses.replace(  # noqa: E731
                o, value=re.sub(r"folx [0-9][0-9.]*", "folx", o.value)
            )
            book, yours = unversion(book), unversion(yours)
        if yours.kind == "unavailable" and (book is None or book.kind != "unavailable"):
            # e.g. folx 0.2.26 is installed apart only by dev.py drift: cannot compare here
            print(f"{pid}: {yours.message}; not compared")
        elif book is None:
            diffs.append(f"{pid}: no recorded outcome for JAX {row} (run dev.py drift)")
        elif not book.same_behaviour(yours, exact=exact):
            diffs.append(
                f"{pid} ({drift.chapter(pid)}):\n  recorded {book.short()[:200]} "
                f"@ {book.frame}\n  now      {yours.short()[:200]} @ {yours.frame}"
            )
    assert not diffs, (
        f"JAX {version} differs from the drift report's row {row}; revisit:\n"
        + "\n".join(diffs)
    )


def test_report_has_rows_for_both_ci_environments():
    vs = drift.versions()
    assert JAX_FLOOR in vs
    assert any(drift.version_key(v)[:2] >= (0, 12) for v in vs)
    for v in vs:
        env = drift.environment(v)
        assert env["jax"] == v and env["date"] and env["python"] and env["platform"]
        missing = [p for p in drift.probe_ids() if drift.outcome(p, v) is None]
        assert not missing, f"JAX {v} lacks {missing}: run python3 dev.py drift"


def test_seed_boundaries_recorded():
    # jax#33947: present on 0.7.1 and 0.8.1, fixed in 0.8.2 (pinned from the runs).
    split = "seed000_split_unused_grad"
    for v in ("0.7.1", "0.8.1"):
        o = drift.outcome(split, v)
        assert (o.kind, o.exc_class) == ("raises", "TypeError")
        assert "is not a valid JAX type" in o.message and o.frame.startswith(
            "jax/_src/core.py:"
        )
        assert "get_aval" in o.frame and o.traceback.count("\n") >= 3
    assert drift.outcome(split, "0.8.2").kind == "returns"
    # folx#40 with the folx of the report (0.2.26): the same frame, fixed by JAX 0.8.2.
    old = "seed000_folx_old_slogdet_grad"
    for v in ("0.7.0", "0.7.1", "0.8.1"):
        o = drift.outcome(old, v)
        assert o.exc_class == "TypeError" and "get_aval" in o.frame
        assert "_split_transpose_rule" in o.traceback
    assert drift.outcome(old, "0.8.2").value.startswith("folx 0.2.26: ")
    # jax#28260: the cast fixes it wherever the varying types exist.
    assert (
        drift.outcome("seed001_linearize_transpose_no_cast", "0.8.2").exc_class
        == "ValueError"
    )
    assert drift.outcome("seed001_linearize_transpose_with_cast", "0.8.2").value == (
        "[ 9., 18., 27., 36., 45., 54., 63., 72.]"
    )  # 4 p^2 t with p = 1.5, t = 1..8


def test_reader_api_shapes():
    vs = drift.versions()
    assert vs == sorted(vs, key=drift.version_key)
    pid = "seed001_linearize_transpose_no_cast"
    first = drift.first_version(pid, "raises")
    assert first is not None and drift.outcome(pid, first).kind == "raises"
    earlier = [v for v in vs if drift.version_key(v) < drift.version_key(first)]
    assert all(drift.outcome(pid, v).kind != "raises" for v in earlier)
    assert drift.first_version(pid, "crash") is None
    assert drift.outcome(pid, "0.0.1") is None
    ref = drift.chapter(pid)
    assert (
        ref.doc == "chapters/02_linearize_transpose"
        and "`shard_map` case" in ref.section
    )
    table = drift.table([pid, "jvp_varying_tangent_hole"])
    lines = table.splitlines()
    assert all(line.count("|") == 4 for line in lines)
    runs = drift.segments(pid)
    # seed001 returns up to 0.8.1 and raises from 0.8.2 on: at least two runs, the
    # second starting where first_version says, and together they cover every version
    assert len(runs) >= 2 and runs[0][0] == vs[0] and runs[-1][1] == vs[-1]
    assert any(first == drift.first_version(pid, "raises") for first, _, _ in runs)
    covered = [v for a, b, _ in runs for v in vs[vs.index(a) : vs.index(b) + 1]]
    assert covered == vs
    n_rows = len(runs) + len(drift.segments("jvp_varying_tangent_hole"))
    assert len(lines) == 2 + n_rows
    assert lines[2].startswith(f"| `{pid}` | {runs[0][0]}")


def test_every_probe_names_an_existing_chapter_section():
    for p in probes.PROBES.values():
        lines = (ROOT / f"{p.chapter.doc}.md").read_text().splitlines()
        titles = {line.lstrip("#").strip() for line in lines if line.startswith("#")}
        assert p.chapter.section in titles, (
            f"{p.id}: no section {p.chapter.section!r} in {p.chapter.doc}"
        )


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: drift.outcome("no_such_probe", "0.8.2"),
            ValueError,
            "unknown probe id",
        ),
        (lambda: drift.outcome(3, "0.8.2"), TypeError, "probe_id must be a str"),
        (
            lambda: drift.outcome("while_loop_reverse_mode", "latest"),
            ValueError,
            "not a JAX release",
        ),
        (
            lambda: drift.outcome("while_loop_reverse_mode", 0.8),
            TypeError,
            "str like '0.8.2'",
        ),
        (
            lambda: drift.first_version("while_loop_reverse_mode", "raised"),
            ValueError,
            "kind must be",
        ),
        (lambda: drift.table("while_loop_reverse_mode"), TypeError, "wrap it"),
        (lambda: drift.table(["nope"]), ValueError, "unknown probe id"),
        (lambda: drift.environment("0.0.1"), ValueError, "no results recorded"),
        (
            lambda: drift.Outcome.from_dict({"kind": "fails"}),
            ValueError,
            "outcome kind",
        ),
        (
            lambda: drift.Outcome("returns").same_behaviour("returns"),
            TypeError,
            "Outcome",
        ),
    ],
)
def test_reader_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_runner_bad_versions_one_line_each():
    from tools import drift as runner

    targets, problems = runner.parse_versions("banana,0.8.2,0.9.0@3.x,0.8.1@3.11.7")
    assert targets == [("0.8.2", runner.VERSIONS["0.8.2"]), ("0.8.1", "3.11.7")]
    assert len(problems) == 2 and all("\n" not in p for p in problems)
    assert "unknown version 'banana'" in problems[0] and "bad Python" in problems[1]


def test_runner_missing_python_is_skipped_others_run(capsys, monkeypatch, tmp_path):
    from tools import drift as runner

    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(runner, "ENVS", tmp_path / "envs")
    # No ready environment may stand in for the missing Python (CI has .venv-floor).
    monkeypatch.setattr(runner, "_reusable", lambda version: None)
    if not Path(runner.shutil.which("pyenv") or "/nonexistent").exists():
        pytest.skip("pyenv is not installed here")
    rc = runner.main(
        ["--versions", "nonsense,0.8.2@3.9.999", "--probes", "ch1_error_hierarchy"]
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert "unknown version 'nonsense'" in out
    assert "0.8.2: skipped: Python 3.9.999 is not installed" in out


_CRASH_SCRIPT = """
import json, os, signal, time
from beyondgrad.drift import child, probes

def segfault():
    os.kill(os.getpid(), signal.SIGSEGV)

def hang():
    time.sleep(30)

ref = probes.ChapterRef("drift", "test")
probes.PROBES["t_segfault"] = probes.Probe("t_segfault", segfault, ref, "x")
probes.PROBES["t_hang"] = probes.Probe("t_hang", hang, ref, "x")
print(json.dumps([child._run_in_fork("t_segfault", 20), child._run_in_fork("t_hang", 0.5)]))
"""


def test_crashing_and_hanging_probes_are_recorded():
    # In a fresh process (forking this multi-threaded test process would be unsafe).
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _CRASH_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    crashed, hung = json.loads(out.stdout)
    assert (crashed["kind"], crashed["message"]) == ("crash", "killed by SIGSEGV")
    assert (hung["kind"], hung["message"]) == ("crash", "timeout after 0.5 s")


def test_runner_runs_only_missing_cells(monkeypatch, tmp_path):
    from tools import drift as runner

    results = tmp_path / "results.json"
    old = {
        "0.8.2": {
            "kind": "returns",
            "value": "x",
            "exc_class": "",
            "message": "",
            "frame": "",
            "traceback": "",
        }
    }
    results.write_text(
        json.dumps(
            {
                "schema": 1,
                "versions": {"0.8.2": {"jax": "0.8.2"}},
                "probes": {},
                "results": {"ch1_error_hierarchy": old},
            }
        )
    )
    monkeypatch.setattr(runner, "RESULTS", results)
    calls = []
    monkeypatch.setattr(
        runner, "ensure_env", lambda v, py: (Path(sys.executable), "fake")
    )
    monkeypatch.setattr(
        runner,
        "run_version",
        lambda py, v, ids, data, timeout: calls.append((v, ids)) or len(ids),
    )
    probe_list = "ch1_error_hierarchy,while_loop_reverse_mode"
    assert runner.main(["--versions", "0.8.2", "--probes", probe_list]) == 0
    assert calls == [("0.8.2", ["while_loop_reverse_mode"])]
    calls.clear()
    assert runner.main(["--versions", "0.8.2", "--probes", probe_list, "--force"]) == 0
    assert calls == [("0.8.2", ["ch1_error_hierarchy", "while_loop_reverse_mode"])]
    saved = json.loads(results.read_text())
    assert saved["results"]["ch1_error_hierarchy"]["0.8.2"]["value"] == "x"  # kept


def test_headline_versions_pinned():
    # The onsets the chapters cite, pinned from the recorded runs.
    fv = drift.first_version
    assert fv("seed001_linearize_transpose_no_cast", "raises") == "0.6.0"
    assert fv("seed001_linearize_transpose_with_cast", "returns") == "0.6.0"
    assert fv("api_lax_pcast", "returns") == JAX_FLOOR
    assert fv("jvp_varying_tangent_hole", "returns") == "0.6.0"
    pvary = [
        v
        for v in drift.versions()
        if drift.outcome("api_lax_pvary", v).kind == "returns"
    ]
    assert pvary[0] == "0.6.0" and drift.version_key(pvary[-1]) < (0, 10)
    assert drift.outcome("api_lax_pvary", "0.10.2").exc_class == "AttributeError"


def test_same_behaviour_exact_compares_message_and_frame():
    """exact=True: also the message (addresses normalized) and the raising frame;
    exact=False: kind, value and class only (frames move between releases)."""
    a = drift.Outcome("raises", exc_class="TypeError", message="bad at 0x7f01",
                      frame="jax/_src/core.py:10 f")  # fmt: skip
    moved = drift.Outcome("raises", exc_class="TypeError", message="bad at 0x7f99",
                          frame="jax/_src/core.py:12 f")  # fmt: skip
    same_frame = drift.Outcome("raises", exc_class="TypeError", message="bad at 0x1",
                               frame="jax/_src/core.py:10 f")  # fmt: skip
    assert a.same_behaviour(same_frame) and not a.same_behaviour(moved)
    assert a.same_behaviour(moved, exact=False)
    other = drift.Outcome("raises", exc_class="ValueError", message="bad at 0x7f01",
                          frame="jax/_src/core.py:10 f")  # fmt: skip
    assert not a.same_behaviour(other, exact=False)


def test_chapter4_type_system_boundaries_pinned():
    # Issue 24: the onsets Chapter 4's new subsections cite, pinned from the runs.
    fv = drift.first_version
    # jax_auto_pcast: absent up to 0.10.0, default True from 0.10.1 on.
    assert fv("auto_pcast_off_psum_invariant", "raises") == "0.10.1"
    assert drift.outcome("auto_pcast_default", "0.10.1").value == "jax_auto_pcast=True"
    assert drift.outcome("auto_pcast_default", JAX_FLOOR).value.startswith("no ")
    # jax.pmap is jit(shard_map(check_vma=False)) from 0.8.0 (the migration guide's).
    assert drift.outcome("pmap_traces_to_shard_map", "0.7.2").value == "xla_pmap"
    assert "check_vma=False" in drift.outcome("pmap_traces_to_shard_map", "0.8.0").value
    # mul_p's JVP rule became defbilinear's prim.bind in 0.8.1, and the one-line jvp
    # with an invariant tangent at a varying primal fails exactly from then on.
    for v in ("0.8.0", "0.8.1"):
        rule = drift.outcome("mul_jvp_rule", v).value
        bad = drift.outcome("jvp_invariant_tangent_lax_mul", v)
        assert ("prim.bind" in rule) == (bad.kind == "raises"), v
    assert "requires varying manual axes" in (
        drift.outcome("jvp_invariant_tangent_lax_mul", JAX_FLOOR).message
    )
    # the jvp-of-grad HVP of jnp.mean(v**2): returns on 0.10.0, raises from 0.10.1.
    assert drift.outcome("hvp_invariant_direction_jnp_mean", "0.10.0").kind == "returns"
    assert drift.outcome("hvp_invariant_direction_jnp_mean", "0.10.1").kind == "raises"
    # the workarounds return on every release with varying types after 0.6.0.
    for v in drift.versions()[drift.versions().index("0.6.1") :]:
        assert drift.outcome("hvp_ones_like_direction", v).kind == "returns", v
        assert drift.outcome("custom_vjp_psum_cotangent", v).value == (
            "[2.8301, 2.8725]"
        ), v


def test_print_only_changes_are_one_run_real_changes_stay():
    """A type printed the old way (ShapedArray(...), {data}) is not a boundary; a
    changed value is. The runs below are pinned from the recorded results."""
    assert drift.printed_as_today("ShapedArray(float32[1]{data})") == (
        "float32[1]{V:data}"
    )
    assert drift.printed_as_today("float32[8@x,4]; {V:x}") == "float32[8@x,4]; {V:x}"
    with pytest.raises(TypeError, match="text must be a str"):
        drift.printed_as_today(3)
    starts = lambda pid: [a for a, _, _ in drift.segments(pid)]  # noqa: E731
    # 0.6.1 (ShapedArray wrapper dropped), 0.7.0 and 0.8.1 ({data} <-> {V:data}) fold
    assert starts("api_lax_pvary") == ["0.5.3", "0.6.0", "0.10.0"]
    assert starts("pbroadcast_type") == ["0.5.3", "0.6.0"]
    assert starts("jvp_hole_jit_sin") == ["0.5.3", "0.6.0"]
    # real changes of value stay boundaries
    assert "0.9.0" in starts("make_mesh_default_axis_types")  # Auto -> Explicit
    assert starts("aval_varying_axes_field") == ["0.5.3", "0.6.0", "0.10.0"]


def test_table_marks_runs_against_the_newest_release_not_right_or_wrong():
    # the jit-ed jvp hole: refused (correctly) on 0.5.3, silently returns since; the
    # newest behaviour is the bug, and the mark says only that 0.5.3 differs from it
    rows = drift.table(["jvp_hole_jit_sin"]).splitlines()[2:]
    assert rows[0].endswith(f"| {drift.CHANGED} raises `ValueError` |")
    assert f"| {drift.AS_NEWEST} returns `tangent type float32[1]" in rows[1]
    newest = drift.outcome("jvp_hole_jit_sin", drift.versions()[-1])
    assert drift.glyph(newest, newest) == drift.AS_NEWEST
    assert drift.glyph(None, newest) == drift.CHANGED
    assert "✓" not in drift.table() and "✗" not in drift.table()

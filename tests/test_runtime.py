import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad import JAX_FLOOR, runtime


def test_describe_reports_this_kernel():
    info = runtime.describe()
    assert info.jax_version == jax.__version__
    assert info.platform in {"cpu", "gpu", "tpu"}
    assert info.device_count == len(jax.devices())
    assert info.cpu_device_count >= runtime.BOOK_DEVICE_COUNT
    assert info.on_colab is False
    text = str(info)
    assert jax.__version__ in text and info.platform in text
    data, meta = info._repr_mimebundle_()
    assert data["text/plain"] == text
    assert meta["beyondgrad_runtime"]["jax_version"] == jax.__version__


def test_ensure_cpu_devices_after_start():
    # conftest asked for 8 before JAX started; asking again for <= 8 is fine.
    assert runtime.ensure_cpu_devices(8) >= 8
    assert runtime.ensure_cpu_devices(1) >= 8


def test_ensure_cpu_devices_too_late_names_the_fix():
    with pytest.raises(RuntimeError, match="Restart the kernel"):
        runtime.ensure_cpu_devices(10_000)


@pytest.mark.parametrize(
    "bad, exc",
    [
        (0, ValueError),
        (-3, ValueError),
        ("8", TypeError),
        (8.0, TypeError),
        (True, TypeError),
    ],
)
def test_ensure_cpu_devices_validates(bad, exc):
    with pytest.raises(exc):
        runtime.ensure_cpu_devices(bad)


@pytest.mark.parametrize(
    "shape, names", [(8, "data"), ((2, 4), ("data", "model")), ((1,), ("data",))]
)
def test_demo_mesh_shapes(shape, names):
    mesh = runtime.demo_mesh(shape, names)
    want = (shape,) if isinstance(shape, int) else shape
    assert tuple(mesh.devices.shape) == tuple(want)
    assert mesh.axis_names == ((names,) if isinstance(names, str) else names)
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_demo_mesh_explicit_axes_and_use():
    mesh = runtime.demo_mesh((2, 4), ("data", "model"), axis_types="explicit")
    assert all(t == AxisType.Explicit for t in mesh.axis_types)
    x = jax.device_put(
        jnp.arange(16.0).reshape(2, 8), NamedSharding(mesh, P("data", "model"))
    )
    out = jax.shard_map(
        lambda b: b * 2,
        mesh=mesh,
        in_specs=P("data", "model"),
        out_specs=P("data", "model"),
    )(x)
    assert jnp.array_equal(out, 2 * jnp.arange(16.0).reshape(2, 8))


def test_demo_mesh_errors():
    with pytest.raises(ValueError, match="axis_names"):
        runtime.demo_mesh((2, 4), ("data",))
    with pytest.raises(ValueError, match="distinct"):
        runtime.demo_mesh((2, 2), ("data", "data"))
    with pytest.raises(ValueError, match="positive"):
        runtime.demo_mesh((0,), ("data",))
    with pytest.raises(RuntimeError, match="ensure_cpu_devices"):
        runtime.demo_mesh(10_000, "data")
    with pytest.raises(ValueError, match="axis_types"):
        runtime.demo_mesh(2, "data", axis_types="manual")


def test_check_setup_passes_here():
    checks = runtime.check_setup(8)
    assert [c.name for c in checks][0] == "JAX version"
    assert all(c.ok for c in checks), "\n".join(map(str, checks))
    assert all(str(c).startswith("✓") for c in checks)


def test_check_setup_reports_missing_devices_with_fix():
    checks = runtime.check_setup(10_000)
    bad = [c for c in checks if not c.ok]
    assert {c.name for c in bad} == {
        "10000 devices for the sharding chapters",
        "shard_map",
    }
    assert "ensure_cpu_devices(10000)" in str(bad[0]) and str(bad[0]).startswith("✗")


def test_jax_floor_is_the_package_requirement():
    from tools.book import jax_floor

    assert JAX_FLOOR == jax_floor()
    installed = tuple(int(p) for p in jax.__version__.split(".")[:3])
    assert installed >= tuple(int(p) for p in JAX_FLOOR.split("."))


def test_ensure_cpu_devices_in_a_fresh_process_creates_exactly_n():
    import subprocess
    import sys

    code = (
        "from beyondgrad import runtime; import jax;"
        "print(runtime.ensure_cpu_devices(3), len(jax.devices('cpu')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "3"]


def test_glue_without_myst_nb_prints_no_name_value_line(monkeypatch, capsys):
    """On Colab (no myst-nb) a hidden glue prints nothing and a shown one shows the
    value itself, as myst-nb does: never a ``name = value`` line to decode."""
    import builtins

    real_import = builtins.__import__

    def no_myst_nb(name, *args, **kwargs):
        if name == "myst_nb":
            raise ImportError("not on Colab")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_myst_nb)
    runtime.glue("ratio", 2.5, display=False)
    assert capsys.readouterr().out == ""
    runtime.glue("ratio", 2.5)
    assert capsys.readouterr().out == "2.5\n"


def test_check_my_jax_lists_exactly_the_recorded_differences(monkeypatch):
    """On a recorded JAX: the run matches its own row, and the differences listed are
    those between the two recorded rows. On a JAX the drift report has not recorded
    (a new release): the differences listed are exactly those between this run and the
    recorded row compared with; nothing is skipped.

    Where dev.py keeps a keyed test cache, the fast probes' outcomes are read from
    test_drift's run of every probe in this environment (drift_record.run_probes_here)
    instead of running them a second time; chapter 0 runs ``check_my_jax()`` itself,
    probes and all, in every book build."""
    import json

    import drift_record

    from beyondgrad import drift
    from tools import executed

    if executed.keyed():
        fast = {p for p in drift.probe_ids() if drift.probe(p).fast}

        def fast_lines(timeout: float) -> str:
            assert timeout > 0
            lines = drift_record.probe_output_here().splitlines()
            return "\n".join(
                ln for ln in lines if json.loads(ln).get("id", "env") in fast | {"env"}
            )

        monkeypatch.setattr(runtime, "_fast_probe_output", fast_lines)

    here = jax.__version__
    recorded = here in drift.versions()
    # One run (the probes take tens of seconds on a loaded machine), compared with
    # another recorded version: the oldest, where most probes differ.
    other = next(v for v in drift.versions() if v != here)
    check = runtime.check_my_jax(other)
    fast = [p for p in drift.probe_ids() if drift.probe(p).fast]
    assert check.jax_version == here and check.book_version == other
    assert check.probes_run == len(fast) == len(check.outcomes)
    if recorded:
        own = [
            p
            for p in fast
            if not drift.outcome(p, here).same_behaviour(check.outcomes[p])
        ]
        assert not own, f"JAX {here} differs from its own recorded row in {own}"
    ran = {p: drift.outcome(p, here) if recorded else check.outcomes[p] for p in fast}
    want = [
        p
        for p in fast
        if not drift.outcome(p, other).same_behaviour(ran[p], exact=False)
    ]
    assert want, f"pick versions that differ: {here} and {other} behave alike"
    assert [d.probe_id for d in check.differences] == want
    text = str(check)
    assert f"{len(check.sections)} chapter section(s) will behave differently" in text
    assert all(str(d.chapter) in text for d in check.differences)


def test_drift_check_text_when_nothing_differs():
    text = str(runtime.DriftCheck("0.8.2", "0.8.2", 3, 1.0, ()))
    assert "No chapter section will behave differently" in text and "3 probes" in text


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"book_version": "0.0.1"}, ValueError, "book_version must be one of"),
        ({"book_version": 8}, ValueError, "book_version must be one of"),
        ({"timeout": 0}, ValueError, "timeout must be a float > 0"),
        ({"timeout": True}, TypeError, "timeout must be a float > 0"),
        ({"timeout": "60"}, TypeError, "timeout must be a float > 0"),
    ],
)
def test_check_my_jax_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        runtime.check_my_jax(**kwargs)


def test_time_calls_reports_the_time_per_call():
    """A 2 ms sleep timed with min_time=20 ms (about 10 calls per sample): each sample
    is the time of one call, not of the loop (sleep overshoots, never undershoots)."""
    import time as _time

    from beyondgrad import measure

    def nap():
        _time.sleep(0.002)
        return 0

    (t,) = measure.time_calls([(nap, ())], repeats=3, min_time=0.02)
    assert len(t.samples) == 3
    assert 0.002 <= t.min <= t.median < 0.010, t  # the loop would be >= 0.02

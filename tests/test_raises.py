"""The %%raises cell magic: show the expected error, go on; stop on anything else."""

import io

import pytest

from beyondgrad import raises


@pytest.fixture(scope="module")
def shell():
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    if ip is None:  # another test module in this process started it first
        from IPython import get_ipython

        ip = get_ipython()
    ip.run_line_magic("load_ext", "beyondgrad.raises")
    ip.run_cell(
        "import jax\n"
        "def leaky(x):\n"
        "    if x > 0:\n"
        "        return x\n"
        "    return 0.1 * x\n"
    )
    return ip


def run(shell, source, capfd):
    result = shell.run_cell(source)
    out, err = capfd.readouterr()
    return result, out + err


def test_the_expected_class_is_shown_and_the_notebook_goes_on(shell, capfd):
    result, text = run(
        shell,
        "%%raises jax.errors.TracerBoolConversionError\njax.jit(leaky)(2.0)\n",
        capfd,
    )
    assert result.success and result.error_in_exec is None
    first, *rest = text.strip().splitlines()
    assert first.startswith("TracerBoolConversionError raised, as expected")
    # The reader's frames: the cell and leaky's `if`, not JAX's internals.
    assert "in leaky" in text and "if x > 0:" in text
    assert "site-packages" not in text and "jax/_src" not in text
    assert "jax.errors.TracerBoolConversionError: Attempted boolean conversion" in text
    # Machine-specific cell file names are replaced; lines fit the page but URLs.
    assert "ipykernel_" not in text and "ipython-input" not in text
    assert all(len(line) <= raises.WIDTH or "://" in line for line in rest)
    # The next cell runs and sees what the failing cell defined before the error.
    assert shell.run_cell("y = 1 + 1").success


def test_assignments_before_the_error_persist(shell, capfd):
    result, _ = run(shell, "%%raises ZeroDivisionError\nbefore = 7\n1 / 0\n", capfd)
    assert result.success and shell.user_ns["before"] == 7


def test_no_error_stops_the_notebook(shell, capfd):
    result, _ = run(shell, "%%raises TypeError\n1 + 1\n", capfd)
    assert isinstance(result.error_in_exec, raises.ExpectedErrorMissing)
    assert "TypeError" in str(result.error_in_exec)


def test_another_class_propagates_unchanged(shell, capfd):
    result, _ = run(shell, "%%raises TypeError\n1 / 0\n", capfd)
    assert type(result.error_in_exec) is ZeroDivisionError


def test_a_subclass_is_another_class(shell, capfd):
    # TracerBoolConversionError is a subclass of ConcretizationTypeError: the lesson
    # pins the exact class, so a change from one to the other must show.
    result, _ = run(
        shell,
        "%%raises jax.errors.ConcretizationTypeError\njax.jit(leaky)(2.0)\n",
        capfd,
    )
    assert type(result.error_in_exec).__name__ == "TracerBoolConversionError"


@pytest.mark.parametrize(
    "line, message",
    [
        ("", "needs an exception class"),
        ("3Error", "needs an exception class"),
        ("nonexistent.Error", "'nonexistent' is not defined here"),
        ("jax.errors.NoSuchError", "jax.errors has no attribute 'NoSuchError'"),
        ("jax.numpy", "is not an exception class"),
        ("len", "is not an exception class"),
    ],
)
def test_a_bad_class_name_is_a_clear_error(shell, capfd, line, message):
    result, _ = run(shell, f"%%raises {line}\n1 / 0\n", capfd)
    assert isinstance(result.error_in_exec, ValueError)
    assert message in str(result.error_in_exec)


def test_expect_error_outside_ipython():
    stream = io.StringIO()
    with raises.expect_error(KeyError, stream=stream):
        {}["missing"]
    assert stream.getvalue().startswith("KeyError raised, as expected")
    assert "test_raises.py" not in stream.getvalue()  # not the reader's cell or package
    with pytest.raises(raises.ExpectedErrorMissing, match="KeyError"):
        with raises.expect_error(KeyError, stream=stream):
            pass
    with pytest.raises(IndexError):
        with raises.expect_error(KeyError, stream=stream):
            [][1]
    with pytest.raises(TypeError, match="needs an exception class"):
        with raises.expect_error("KeyError"):  # type: ignore[arg-type]
            pass


def test_package_frames_are_the_readers_too():
    from beyondgrad import tracers

    def boom():
        raise RuntimeError("x" * 200)

    try:
        boom()
    except RuntimeError as e:
        text = raises.format_error(e)
    assert "in boom" not in text  # a test file is neither a cell nor the package
    assert raises._is_readers_frame(tracers.__file__)
    assert raises._is_readers_frame("<ipython-input-3-abc>")
    assert raises._is_readers_frame("/tmp/ipykernel_1/2.py")
    assert not raises._is_readers_frame(pytest.__file__)  # an installed library
    assert not raises._is_readers_frame("<frozen runpy>")


@pytest.mark.parametrize(
    "shown, readable",
    [
        ("TRACING CACHE MISS at /tmp/ipykernel_812/3738211955.py:9:11 because",
         "TRACING CACHE MISS at <cell>:9:11 because"),
        ("at 3738211955.py:9:11", "at <cell>:9:11"),
        ("/usr/lib/python3.12/site-packages/jax/_src/numpy/lax_numpy.py:3186",
         "jax/_src/numpy/lax_numpy.py:3186"),
        ('File "/work/x/src/beyondgrad/exercises/ch1.py", line 78',
         'File "beyondgrad/exercises/ch1.py", line 78'),
        ("<ipython-input-4-1a2b>", "<cell>"),
        ("see jax/_src/pjit.py:12 and 2.5", "see jax/_src/pjit.py:12 and 2.5"),
    ],
)  # fmt: skip
def test_readable_paths(shown, readable):
    assert raises.readable_paths(shown) == readable


def test_readable_paths_filter_rewrites_log_records():
    import logging

    record = logging.LogRecord(
        "jax._src.pjit", logging.WARNING, "x", 1,
        "MISS at %s:9:11", ("/tmp/ipykernel_1/123456789.py",), None,
    )  # fmt: skip
    assert raises.ReadablePaths().filter(record)
    assert record.getMessage() == "MISS at <cell>:9:11"

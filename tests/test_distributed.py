"""Chapter 5's sharded VMC step across two processes equals the single-process result.

Two worker processes (``tests/_distributed_worker.py``) join one JAX job through
``jax.distributed.initialize`` on 127.0.0.1, 4 CPU devices each, and run
``sharded_energy_and_grad`` on one global 8-device mesh with each process holding half
of the walkers. A third process computes the reference in one process: on one device
(``energy_and_grad``) and sharded over its own 8 devices. All three run in float64.

``launch`` bounds the job in time (``TIMEOUT``), kills every process it started
whatever happens, and the workers use only 127.0.0.1 (the coordinator and the Gloo
collectives are bound to it).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest
from _distributed_worker import (  # tests/ is on sys.path under pytest
    N_WALKERS,
    free_loopback_port,
    launch,
)

TIMEOUT = 120  # seconds for the three processes together
NUM_PROCESSES = 2
LOCAL_DEVICES = 4

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="multi-process CPU collectives: Linux/macOS only"
)


def assert_same(got: dict, want: dict, where: str, rtol: float = 1e-10) -> None:
    """Energy and every gradient leaf agree (float64 on both sides)."""
    np.testing.assert_allclose(
        got["energy"], want["energy"], rtol=rtol, err_msg=f"{where}: energy"
    )
    assert got["grad"].keys() == want["grad"].keys(), (
        f"{where}: different parameter trees"
    )
    for name in want["grad"]:
        np.testing.assert_allclose(
            np.asarray(got["grad"][name]),
            np.asarray(want["grad"][name]),
            rtol=rtol,
            atol=1e-12,
            err_msg=f"{where}: gradient {name}",
        )


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return launch(
        tmp_path_factory.mktemp("distributed"),
        num_processes=NUM_PROCESSES,
        local_devices=LOCAL_DEVICES,
        timeout=TIMEOUT,
    )


def test_two_processes_form_one_job(job):
    results, _, _ = job
    for i, r in enumerate(results):
        assert r["process_index"] == i
        assert r["process_count"] == NUM_PROCESSES
        assert r["device_count"] == NUM_PROCESSES * LOCAL_DEVICES
        assert r["local_device_count"] == LOCAL_DEVICES
        # the walkers are one global array that no single process holds entirely
        assert r["walkers_fully_addressable"] is False
        assert r["local_walker_shards"] == LOCAL_DEVICES
        assert r["walkers_to_numpy"] != "ok", (
            "a process cannot fetch the other process's walkers"
        )
        # the replicated outputs span both processes too, but each process has a full copy
        assert (
            r["energy_fully_replicated"] is True
            and r["energy_fully_addressable"] is False
        )
        assert r["energy_to_numpy"] == "ok"
    # each process contributed its own half of the batch, and the halves tile it
    half = N_WALKERS // NUM_PROCESSES
    assert [tuple(r["walker_rows"]) for r in results] == [(0, half), (half, N_WALKERS)]


def test_sharded_step_across_processes_equals_single_process(job):
    results, reference, _ = job
    # the reference itself: one device and an 8-device mesh in one process agree
    assert_same(
        reference["one_process_sharded"],
        reference["one_device"],
        "one process, sharded vs one device",
    )
    for i, r in enumerate(results):
        assert_same(
            r["result"],
            reference["one_device"],
            f"process {i} of {NUM_PROCESSES} vs one device",
        )
    # the outputs are replicated: both processes hold bitwise the same values
    assert results[0]["result"] == results[1]["result"]


def test_the_compared_quantities_are_not_trivial(job):
    _, reference, _ = job
    grad = reference["one_device"]["grad"]
    assert set(grad) == {"['b1']", "['b2']", "['decay']", "['w1']", "['w2']", "['wl']"}
    assert np.isfinite(reference["one_device"]["energy"])
    assert sum(float(np.sum(np.asarray(g) ** 2)) for g in grad.values()) > 1e-6


def test_a_hanging_job_is_killed_within_its_timeout(tmp_path, monkeypatch):
    # A worker that waits for a partner which never comes (num_processes=2, one started)
    # must be stopped by launch's timeout, and leave no process behind.
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def recording_popen(cmd, *args, **kwargs):
        if "--process-id" in cmd and cmd[cmd.index("--process-id") + 1] == "1":
            cmd = [
                sys.executable,
                "-c",
                "import time; time.sleep(600)",
            ]  # stands in for a hung process
        proc = real_popen(cmd, *args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    with pytest.raises(TimeoutError, match="did not finish within 3 s"):
        launch(tmp_path, num_processes=2, local_devices=1, timeout=3)
    assert started and all(p.poll() is not None for p in started)


def test_free_loopback_port_is_free_on_loopback():
    port = free_loopback_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # would raise OSError if it were taken

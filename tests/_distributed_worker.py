"""The two-process JAX job of tests/test_distributed.py (and of the multi-host appendix).

Run the whole job (two workers and the single-process reference, on a free loopback
port, bounded in time)::

    python tests/_distributed_worker.py --launch /tmp/two-processes

or one process by hand, one command per process (what a cluster launcher does)::

    python tests/_distributed_worker.py --port 43210 --process-id 0 --num-processes 2 --out r0.json
    python tests/_distributed_worker.py --port 43210 --process-id 1 --num-processes 2 --out r1.json

Each process owns ``--local-devices`` CPU devices (4 by default, so 8 in all). Together
they build one global mesh over all 8 devices, give each process its half of the
walkers, and run Chapter 5's ``sharded_energy_and_grad``: the same ``shard_map`` code as
on one machine. ``--single`` runs the reference in one process with 8 devices:
``energy_and_grad`` on one device and ``sharded_energy_and_grad`` over a local mesh.

Everything runs in float64, so that the comparison measures the distribution and not
float32 rounding in a different summation order. The workers never contact anything
but 127.0.0.1 and listen nowhere else: the coordinator is bound to it
(``coordinator_bind_address``), and so are the Gloo CPU collectives
(:func:`pin_gloo_to_loopback`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

N_ELECTRONS = 4
HIDDEN = 8
N_WALKERS = 16  # 2 per device on the 8-device mesh
SEED = 0


def pin_gloo_to_loopback() -> None:
    """Make JAX's Gloo CPU collectives listen on 127.0.0.1 instead of this host's name.

    By default Gloo listens on the address that the machine's hostname resolves to,
    which may be a network interface rather than loopback; for a test that must stay on
    loopback the CPU client is built with ``hostname="127.0.0.1"``. The private JAX
    names this needs live behind :func:`beyondgrad.compat.gloo_loopback_cpu_backend`.
    Call it after ``jax.distributed.initialize`` and before anything touches devices.
    """
    from beyondgrad import compat

    compat.gloo_loopback_cpu_backend("127.0.0.1")


def global_inputs():
    """Parameters and the global batch of walkers, the same in every process.

    Every process computes the full arrays from the same seeds; below, each keeps only
    the rows its devices hold. (On a real cluster each host would sample its own walkers.)
    """
    import jax

    from beyondgrad.wavefunctions import init_params

    params = init_params(
        jax.random.key(SEED), N_ELECTRONS, hidden=HIDDEN, dtype=np.float64
    )
    walkers = np.random.default_rng(SEED).normal(size=(N_WALKERS, N_ELECTRONS, 3))
    return params, walkers


def to_json(energy, grad) -> dict:
    import jax

    leaves, _ = jax.tree_util.tree_flatten_with_path(grad)
    return {
        "energy": float(energy),
        "grad": {
            jax.tree_util.keystr(path): np.asarray(leaf).tolist()
            for path, leaf in leaves
        },
    }


def run_single(local_devices: int) -> dict:
    """Reference: one process, one device (energy_and_grad) and one local mesh (sharded)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from beyondgrad import runtime
    from beyondgrad.vmc import energy_and_grad, sharded_energy_and_grad
    from beyondgrad.wavefunctions import mlp_log_psi

    params, walkers = global_inputs()
    energy, grad = energy_and_grad(
        mlp_log_psi, params, jax.numpy.asarray(walkers), method="loop"
    )
    mesh = runtime.demo_mesh(local_devices, "data")
    s_energy, s_grad = sharded_energy_and_grad(
        mlp_log_psi,
        params,
        jax.device_put(walkers, NamedSharding(mesh, P("data"))),
        mesh,
        method="loop",
    )
    return {
        "one_device": to_json(energy, grad),
        "one_process_sharded": to_json(s_energy, s_grad),
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
    }


def run_multi(
    port: int, process_id: int, num_processes: int, local_devices: int
) -> dict:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from beyondgrad import compat
    from beyondgrad.vmc import sharded_energy_and_grad
    from beyondgrad.wavefunctions import mlp_log_psi

    # 1. Join the job. Process 0 also runs the coordinator service; by default it
    #    listens on every interface, so the test binds it to loopback explicitly.
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=f"127.0.0.1:{port}",
        initialization_timeout=60,
    )
    pin_gloo_to_loopback()  # test-only: keep the CPU collectives on 127.0.0.1

    # 2. jax.devices() now lists every process's devices; jax.local_devices() only ours.
    assert jax.process_index() == process_id
    mesh = compat.make_mesh((jax.device_count(),), ("data",), devices=jax.devices())

    # 3. Global arrays from process-local pieces. Parameters are replicated: every
    #    process passes the same full value. Walkers are split along the batch: each
    #    process passes only the rows that live on its own devices.
    params, walkers = global_inputs()
    replicated = NamedSharding(mesh, P())
    params = jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(replicated, np.asarray(a)),
        params,
    )
    batch = NamedSharding(mesh, P("data"))
    rows = process_rows(batch, walkers.shape)
    walkers_global = jax.make_array_from_process_local_data(
        batch, walkers[rows], walkers.shape
    )

    # 4. The same call as on one machine.
    energy, grad = sharded_energy_and_grad(
        mlp_log_psi, params, walkers_global, mesh, method="loop"
    )

    # 5. Outputs are replicated (out_specs P()): every process holds the full value
    #    and reads it from one of its own devices.
    energy_here = energy.addressable_data(0)
    grad_here = jax.tree.map(lambda g: g.addressable_data(0), grad)
    return {
        "result": to_json(energy_here, grad_here),
        "energy_fully_replicated": energy.is_fully_replicated,
        "energy_fully_addressable": energy.is_fully_addressable,
        "walkers_to_numpy": to_numpy_outcome(walkers_global),
        "energy_to_numpy": to_numpy_outcome(energy),
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "walker_rows": [rows.start, rows.stop],
        "walkers_fully_addressable": walkers_global.is_fully_addressable,
        "local_walker_shards": len(walkers_global.addressable_shards),
    }


def to_numpy_outcome(x) -> str:
    """``"ok"`` if ``np.asarray(x)`` works in this process, else ``"ClassName: first line"``."""
    try:
        np.asarray(x)
    except Exception as e:  # recorded for the test and the appendix, not hidden
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{type(e).__name__}: {first}"
    return "ok"


def process_rows(sharding, global_shape: tuple[int, ...]) -> slice:
    """The contiguous block of leading-axis rows that this process's devices hold."""
    starts, stops = [], []
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        rows = index[0]
        starts.append(rows.start or 0)
        stops.append(global_shape[0] if rows.stop is None else rows.stop)
    lo, hi = min(starts), max(stops)
    if sum(b - a for a, b in set(zip(starts, stops))) != hi - lo:
        raise ValueError(
            f"this process's rows are not one contiguous block: {sorted(zip(starts, stops))}"
        )
    return slice(lo, hi)


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict[str, str]:
    """The workers' environment: this checkout's package, CPU only, no inherited XLA flags."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")])
    )
    env["JAX_PLATFORMS"] = "cpu"  # a CPU test, also on a machine with a GPU
    env.pop("XLA_FLAGS", None)  # device counts come from --local-devices
    return env


def launch(
    workdir: Path,
    *,
    num_processes: int = 2,
    local_devices: int = 4,
    timeout: float = 120.0,
) -> tuple[list[dict], dict, float]:
    """Run ``num_processes`` workers as one JAX job, plus the single-process reference.

    All processes start at once; together they get ``timeout`` seconds. Whatever
    happens, no process outlives this call (``finally: kill``). Returns the workers'
    results (in process order), the reference and the wall time. Raises
    ``TimeoutError`` or ``RuntimeError`` with the tail of every log when a process
    hangs or fails.
    """
    if num_processes < 1 or local_devices < 1:
        raise ValueError(
            f"need num_processes >= 1 and local_devices >= 1, got {num_processes}, {local_devices}"
        )
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_loopback_port()
    outs = [workdir / f"process{i}.json" for i in range(num_processes)]
    ref_out = workdir / "reference.json"
    me = [sys.executable, str(Path(__file__).resolve())]
    commands = [
        [
            *me,
            "--port",
            str(port),
            "--process-id",
            str(i),
            "--num-processes",
            str(num_processes),
            "--local-devices",
            str(local_devices),
            "--out",
            str(out),
        ]
        for i, out in enumerate(outs)
    ]
    commands.append(
        [
            *me,
            "--single",
            "--local-devices",
            str(num_processes * local_devices),
            "--out",
            str(ref_out),
        ]
    )
    logs = [workdir / f"log{i}.txt" for i in range(len(commands))]
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    try:
        for cmd, log in zip(commands, logs):
            with open(log, "w") as f:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        env=worker_env(),
                        cwd=ROOT,
                    )
                )
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, t0 + timeout - time.perf_counter()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"the workers did not finish within {timeout:.0f} s\n{_tails(logs)}"
                ) from None
    finally:
        for proc in procs:  # always: no worker outlives the call
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    seconds = time.perf_counter() - t0
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise RuntimeError(
            f"workers (index, exit code) {failed} failed\n{_tails(logs)}"
        )
    return (
        [json.loads(o.read_text()) for o in outs],
        json.loads(ref_out.read_text()),
        seconds,
    )


def _tails(logs: list[Path], lines: int = 25) -> str:
    return "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-lines:])
        for p in logs
        if p.exists()
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--launch",
        metavar="DIR",
        help="start the whole job (workers and reference), results in DIR",
    )
    ap.add_argument("--out", help="where to write this process's JSON result")
    ap.add_argument(
        "--local-devices", type=int, default=4, help="CPU devices in this process"
    )
    ap.add_argument(
        "--single", action="store_true", help="single-process reference run"
    )
    ap.add_argument("--port", type=int, help="coordinator port on 127.0.0.1")
    ap.add_argument("--process-id", type=int)
    ap.add_argument("--num-processes", type=int, default=2)
    ns = ap.parse_args(argv)
    if ns.launch:
        results, reference, seconds = launch(
            Path(ns.launch),
            num_processes=ns.num_processes,
            local_devices=ns.local_devices,
        )
        want = reference["one_device"]["energy"]
        for r in results:
            print(
                f"process {r['process_index']}/{r['process_count']}: {r['local_device_count']} of "
                f"{r['device_count']} devices, walker rows {r['walker_rows']}, energy {r['result']['energy']!r}"
            )
        print(f"one process, one device: energy {want!r}; wall time {seconds:.1f} s")
        return 0
    if not ns.out:
        ap.error("--out is required (or pass --launch DIR)")

    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update(
        "jax_platforms", "cpu"
    )  # a CPU test, even on a machine with a GPU
    jax.config.update("jax_num_cpu_devices", ns.local_devices)
    jax.config.update(
        "jax_cpu_collectives_implementation", "gloo"
    )  # the default since 0.8; stated anyway

    t0 = time.perf_counter()
    if ns.single:
        result = run_single(ns.local_devices)
    else:
        if ns.port is None or ns.process_id is None:
            ap.error(
                "multi-process mode needs --port and --process-id (or pass --single)"
            )
        result = run_multi(ns.port, ns.process_id, ns.num_processes, ns.local_devices)
    result["seconds"] = time.perf_counter() - t0
    result["jax_version"] = jax.__version__
    with open(ns.out, "w") as f:
        json.dump(result, f)
    if not ns.single:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

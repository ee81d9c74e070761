"""Run probes on the JAX of this interpreter, each in a fresh forked process.

    python -m beyondgrad.drift.child [--timeout S] [--fast] [PROBE_ID ...]

Prints one JSON line describing the environment (``{"env": {...}}``), then one JSON
line per probe (``{"id": ..., "outcome": {...}}``). This process asks for 8 CPU devices
and imports JAX without starting a backend; each probe then runs in a child forked from
it, so every probe sees a fresh JAX (no caches, no devices started) while the import
is paid once. A probe that kills its process (a segfault) or runs past the timeout is
recorded as ``crash``. Must run in a process where JAX has not started: a notebook
calls it as a subprocess (see :func:`beyondgrad.runtime.check_my_jax`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import select
import signal
import sys
import time
import traceback
from typing import Any

DEVICES = 8
_HEX = re.compile(r"0x[0-9a-fA-F]+")


def _setup_env() -> None:
    # Every version reads XLA_FLAGS when its CPU backend starts; newer ones also have
    # jax_num_cpu_devices (set below, after import, before any backend starts).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags = f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip()
    os.environ["XLA_FLAGS"] = flags
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["JAX_TRACEBACK_FILTERING"] = "off"  # keep JAX's own frames
    os.environ.setdefault("JAX_ENABLE_X64", "0")


def _rel(path: str) -> str:
    """A frame's file relative to its package: 'jax/_src/...', 'beyondgrad/...'."""
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/src/"):
        if marker in p:
            return p.rsplit(marker, 1)[1]
    return p.rsplit("/", 1)[-1]


def _outcome_of_exception(e: BaseException) -> dict:
    frames = traceback.extract_tb(e.__traceback__)
    jax_frames = [f for f in frames if _rel(f.filename).startswith("jax/")]
    frame = ""
    if jax_frames:
        f = jax_frames[-1]
        frame = f"{_rel(f.filename)}:{f.lineno} {f.name}"
    lines = str(e).strip().splitlines()
    message = lines[0].strip() if lines else ""
    if message.endswith(":") and len(lines) > 1:  # "...: " then the detail on line 2
        message = f"{message} {lines[1].strip()}"
    message = _HEX.sub("0x…", message)
    # The book's own frames without line numbers: they move whenever a probe is edited.
    short = [
        f"{_rel(f.filename)} {f.name}"
        if _rel(f.filename).startswith("beyondgrad/")
        else f"{_rel(f.filename)}:{f.lineno} {f.name}"
        for f in frames[-10:]
    ]
    cls = type(e)
    name = (
        cls.__qualname__
        if cls.__module__ == "builtins"
        else f"{cls.__module__}.{cls.__qualname__}"
    )
    # jax.errors classes are defined in jax._src.errors: name them as users import them.
    name = name.replace("jax._src.errors.", "jax.errors.")
    tb = "\n".join([*short, f"{name}: {message}"])
    return {
        "kind": "raises",
        "value": "",
        "exc_class": name,
        "message": message[:400],
        "frame": frame,
        "traceback": tb,
    }


_EMPTY = {
    "kind": "",
    "value": "",
    "exc_class": "",
    "message": "",
    "frame": "",
    "traceback": "",
}


def _probe_result(pid_name: str) -> bytes:
    """Run one probe in this (forked) process; its outcome as JSON bytes."""
    from beyondgrad.drift.probes import PROBES

    try:
        try:
            out = {**_EMPTY, "kind": "returns", "value": str(PROBES[pid_name].run())}
        except ModuleNotFoundError as e:  # e.g. folx does not install with this JAX
            out = {
                **_EMPTY,
                "kind": "unavailable",
                "exc_class": "ModuleNotFoundError",
                "message": str(e).splitlines()[0],
            }
        except BaseException as e:  # noqa: BLE001 - the exception is the result
            out = _outcome_of_exception(e)
        return json.dumps(out).encode()
    except BaseException as e:  # noqa: BLE001
        return json.dumps(
            {
                **_EMPTY,
                "kind": "crash",
                "exc_class": type(e).__name__,
                "message": f"could not record the outcome: {e}"[:400],
            }
        ).encode()


class _Running:
    """A probe running in a forked child; its outcome arrives through a pipe."""

    def __init__(self, pid_name: str, timeout: float):
        self.name, self.timeout = pid_name, timeout
        r, w = os.pipe()
        self.t0 = time.perf_counter()
        self.deadline = time.monotonic() + timeout
        self.pid = os.fork()
        if self.pid == 0:  # the probe's own process
            os.close(r)
            data = _probe_result(pid_name)
            with os.fdopen(w, "wb") as fh:
                fh.write(data)
            os._exit(0)
        os.close(w)
        self.fd = r
        self.chunks: list[bytes] = []

    def read(self) -> bool:
        """Read what is available; True at end of output."""
        chunk = os.read(self.fd, 1 << 16)
        self.chunks.append(chunk)
        return not chunk

    def finish(self, timed_out: bool) -> dict:
        os.close(self.fd)
        if timed_out:
            os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        crash: dict[str, Any] = {**_EMPTY, "kind": "crash"}
        if timed_out:
            out = {**crash, "message": f"timeout after {self.timeout:g} s"}
        elif os.WIFSIGNALED(status):
            out = {
                **crash,
                "message": f"killed by {signal.Signals(os.WTERMSIG(status)).name}",
            }
        else:
            try:
                out = json.loads(b"".join(self.chunks).decode())
            except ValueError:
                code = os.waitstatus_to_exitcode(status)
                out = {
                    **crash,
                    "message": f"exited with status {code} without a result",
                }
        out["seconds"] = round(time.perf_counter() - self.t0, 2)
        return out


def run_probes(ids: list[str], timeout: float, jobs: int = 1):
    """Yield ``(id, outcome)`` for each probe, at most ``jobs`` forked children at once."""
    pending = list(ids)
    running: dict[int, _Running] = {}
    while pending or running:
        while pending and len(running) < max(1, jobs):
            job = _Running(pending.pop(0), timeout)
            running[job.fd] = job
        now = time.monotonic()
        wait = max(0.0, min(j.deadline for j in running.values()) - now)
        ready, _, _ = select.select(list(running), [], [], wait)
        for fd in ready:
            if running[fd].read():
                job = running.pop(fd)
                yield job.name, job.finish(timed_out=False)
        now = time.monotonic()
        for fd in [fd for fd, j in running.items() if j.deadline <= now]:
            job = running.pop(fd)
            yield job.name, job.finish(timed_out=True)


def _run_in_fork(pid_name: str, timeout: float) -> dict:
    """One probe in a fresh forked process (see :func:`run_probes`)."""
    return next(run_probes([pid_name], timeout))[1]


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import jax

    try:
        folx = version("folx")
    except PackageNotFoundError:
        folx = ""
    return {
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "python": platform.python_version(),
        "platform": f"{platform.system()}-"
        f"{platform.machine()} cpu x{DEVICES} (simulated)",
        "folx": folx,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per probe")
    ap.add_argument("--fast", action="store_true", help="only the probes marked fast")
    ap.add_argument("--jobs", type=int, default=1, help="probes running at once")
    ap.add_argument("ids", nargs="*", help="probe ids (default: all)")
    ns = ap.parse_args(argv)
    _setup_env()
    from beyondgrad.drift.probes import PROBES

    unknown = [i for i in ns.ids if i not in PROBES]
    if unknown:
        print(
            f"unknown probe id(s): {', '.join(unknown)}; known: {', '.join(PROBES)}",
            file=sys.stderr,
        )
        return 2
    ids = ns.ids or [p.id for p in PROBES.values() if p.fast or not ns.fast]
    import jax  # imported once here, before any fork; no backend starts

    if "jax_num_cpu_devices" in jax.config.values:
        jax.config.update("jax_num_cpu_devices", DEVICES)
    print(json.dumps({"env": environment()}), flush=True)
    for pid_name, outcome in run_probes(ids, ns.timeout, ns.jobs):
        print(json.dumps({"id": pid_name, "outcome": outcome}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

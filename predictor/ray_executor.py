"""The Ray executor of ``predictor.explore`` (the ``[ray]`` extra).

One Ray task per chunk of candidates (``chunk_size``, one by default), on the
cluster at ``address`` ("auto": the one ``ray start`` runs on this machine) or,
without one, on a local Ray instance of ``workers`` CPUs started for the run
and shut down after it. The run's state (the factory and the configs) is put
in the object store once. A task whose worker process dies is retried by Ray
(``max_retries``); after that its candidates are recorded as failed with a
one-line error. Results come back to the driver as tasks finish and are
written there, so the driver's ``out`` folder is the only one that matters.

A factory defined in a file that workers cannot import (a SPACE.py, a test
module, a script) is shipped by value (cloudpickle).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import Callable

from predictor import candidate
from predictor.errors import InvalidArgumentError, MissingExtraError

# Tasks in flight per CPU of the cluster: enough to keep every worker busy
# while results come back, few enough to stop early on an interrupt.
IN_FLIGHT_PER_CPU = 2


def _ray():
    try:
        import ray
    except ImportError:
        raise MissingExtraError("ray", "ray", "Ray runs (executor='ray', --executor ray)") from None
    return ray


def _task(state: dict, chunk: list[int]) -> list[dict]:
    candidate._single_threaded()
    return candidate.evaluate_chunk(chunk, state)


def _ship_by_value(ray, factory: Callable) -> None:
    """Pickle the factory's module by value unless workers can import it
    (an installed package)."""
    target = getattr(factory, "func", factory)
    name = getattr(target, "__module__", None)
    module = sys.modules.get(name or "")
    if module is None or name == "__main__" or name.split(".")[0] == "predictor":
        return
    origin = getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    installed = origin is not None and any(
        part in ("site-packages", "dist-packages") for part in origin.split(os.sep))
    if spec is None or not installed:
        ray.cloudpickle.register_pickle_by_value(module)


def _check_reachable(address: str) -> None:
    """Refuse a HOST:PORT nobody listens on in one line: Ray itself would
    retry connecting for minutes."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local": Ray resolves (and refuses) those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot reach the Ray cluster at {address} "
                                   f"({getattr(exc, 'strerror', None) or exc})") from None


@contextlib.contextmanager
def session(workers: int | None = None, address: str | None = None):
    """Ray, connected: to the cluster at `address`, or to a local instance of
    `workers` CPUs started here and shut down on exit; a Ray the caller has
    already initialised is used as it is."""
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    opts = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        if address:
            _check_reachable(address)
            ray.init(address=address, **opts)
        else:
            ray.init(num_cpus=workers or os.cpu_count() or 1, **opts)
    except InvalidArgumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray's own errors are many
        where = f"at {address}" if address else "(a local one)"
        raise InvalidArgumentError(f"cannot start or reach the Ray cluster {where}: "
                                   f"{candidate.one_line(exc)}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def run(state: dict, chunks: list[list[int]], on_records: Callable[[list[dict]], None], *,
        max_retries: int = 3) -> None:
    """Evaluate every chunk as a Ray task (inside a `session`), handing each
    chunk's records to `on_records` (in this process) as it completes."""
    ray = _ray()
    _ship_by_value(ray, state["factory"])
    remote = ray.remote(num_cpus=1, max_retries=max_retries)(_task)
    state_ref = ray.put(state)
    cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
    cap = max(1, IN_FLIGHT_PER_CPU * cpus)
    pending = list(range(len(chunks)))[::-1]
    running: dict = {}
    while pending or running:
        while pending and len(running) < cap:
            c = pending.pop()
            running[remote.remote(state_ref, chunks[c])] = c
        ready, _ = ray.wait(list(running), num_returns=1)
        for ref in ready:
            c = running.pop(ref)
            try:
                recs = ray.get(ref)
            except ray.exceptions.WorkerCrashedError:
                recs = candidate.dead_worker_records(state, chunks[c], max_retries + 1)
            except ray.exceptions.RayError as exc:
                msg = f"Ray task failed: {candidate.one_line(exc)}"
                recs = [{"key": state["keys"][i], "config": state["configs"][i],
                         "status": "failed", "error": msg} for i in chunks[c]]
            on_records(recs)

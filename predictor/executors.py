"""The local executor of ``predictor.explore``: a process pool over this
machine's cores.

Workers are forked where the platform allows it (Linux): they inherit the
imported torch and the run's state (the factory may be a lambda or a closure),
and start in milliseconds. Elsewhere they are spawned and the factory must be
importable (a module-level function).

At most one chunk of candidates is in flight per worker, so when a worker
dies (killed, out of memory, a crash in native code) the pool knows which
chunks were running: the pool is rebuilt and their candidates run again, one
at a time, so that a death is then charged to its own candidate. A candidate
whose worker dies more than `max_retries` times is recorded as failed with a
one-line error; the others are unharmed. A candidate that raises is never a dead worker: it is
recorded by ``candidate.evaluate`` and the run goes on.

Each worker starts a session of its own (``os.setsid``, where the platform has
it). With the kernel's autogroup scheduling (``sched_autogroup_enabled``, the
default of many desktop distributions) the processes of one session share one
scheduling share, so on a busy machine a pool in the driver's session gets no
more CPU than the driver alone; in their own sessions the workers get a share
each, as Ray's do (the raylet starts them in their own sessions). Out of the
terminal's process group a worker no longer receives the terminal's Ctrl-C or
hang-up, so it is bound to the driver instead: on Linux the kernel kills it
when the driver dies (``PR_SET_PDEATHSIG``; the signal comes when the thread
that started the pool ends, and the pool never outlives ``run_local``),
elsewhere a watchdog thread exits when its parent changes; an interrupted run
(Ctrl-C in the driver, an error while writing) kills the workers before it
returns.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from predictor import candidate


def _context():
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


def _bind_to(driver: int) -> None:
    """End this worker when `driver` (its parent) dies."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            bound = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            bound = False
        if bound:
            if os.getppid() != driver:   # the driver died before the prctl
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="driver-watchdog", daemon=True).start()


def _worker_start(driver: int, state: dict) -> None:
    """The pool's initializer: a session of its own, bound to the driver."""
    if hasattr(os, "setsid"):
        _bind_to(driver)
        try:
            os.setsid()
        except OSError:   # already a session (or process group) leader
            pass
    candidate.set_state(state)


def _kill_workers(processes: list) -> None:
    """Kill the workers of a pool that is being abandoned: in their own
    sessions they see no Ctrl-C, and a shutdown without waiting would still
    let each finish its chunk (the interpreter joins the pool at exit)."""
    for proc in processes:
        try:
            if proc.is_alive():
                proc.kill()
        except (OSError, ValueError):   # already gone, or closed
            pass
    for proc in processes:
        try:
            proc.join(5)
        except (OSError, ValueError, AssertionError):
            pass


def run_local(state: dict, chunks: list[list[int]], on_records: Callable[[list[dict]], None], *,
              workers: int, max_retries: int = 3) -> None:
    """Evaluate every chunk on a pool of `workers` processes, handing each
    chunk's records to `on_records` (in this process) as it completes."""
    chunks = list(chunks)
    pending = list(range(len(chunks)))[::-1]     # a stack: chunk 0 first
    suspects: list[int] = []                     # lost with a worker: run alone
    deaths = [0] * len(chunks)
    ctx = _context()
    if ctx.get_start_method() == "fork":
        candidate.warm_up(state["settings"])

    def suspect(c: int) -> None:
        # One candidate at a time, so that a death names its candidate.
        if len(chunks[c]) == 1:
            suspects.append(c)
            return
        for i in chunks[c]:
            chunks.append([i])
            deaths.append(deaths[c])
            suspects.append(len(chunks) - 1)

    while pending or suspects:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                   initializer=_worker_start, initargs=(os.getpid(), state))
        running: dict = {}
        broken = False
        clean = False
        try:
            while pending or suspects or running:
                if suspects:
                    # Suspects run alone: a dead worker is then theirs.
                    if not running:
                        c = suspects.pop()
                        running[pool.submit(candidate.evaluate_chunk, chunks[c])] = c
                else:
                    while pending and len(running) < workers:
                        c = pending.pop()
                        running[pool.submit(candidate.evaluate_chunk, chunks[c])] = c
                alone = len(running) == 1
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    c = running.pop(fut)
                    try:
                        recs = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        if alone:
                            deaths[c] += 1
                            if deaths[c] > max_retries:
                                on_records(candidate.dead_worker_records(state, chunks[c],
                                                                         deaths[c]))
                                continue
                        suspect(c)
                        continue
                    on_records(recs)
                if broken:
                    # Every chunk still running is lost with the pool.
                    for c in running.values():
                        suspect(c)
                    running.clear()
                    break
            clean = not broken
        finally:
            # An interrupted run does not wait for the chunks still running.
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=clean, cancel_futures=True)
            if not clean:
                _kill_workers(processes)

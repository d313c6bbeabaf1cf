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
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from predictor import candidate


def _context():
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


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
                                   initializer=candidate.set_state, initargs=(state,))
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
            pool.shutdown(wait=clean, cancel_futures=True)

"""A gate's independent (arm, seed) runs: in this process, over a local process pool, or on
a Dask distributed cluster.

Every run is one :class:`RunJob` executed by :func:`execute_run` wherever it lands: it trains,
then appends its own ``gate_run`` row through the registry's locked append
(:func:`tern.decide.registry.append_row`), so a worker that is killed loses only the run it
was training (no row: resume trains it again) and the driver only collects rows.

- ``workers=1`` (default): one run after the other in this process.
- ``workers=N``: a local ``ProcessPoolExecutor`` of N spawned processes (not forked: torch's
  and numba's thread pools do not survive a fork), each run with ``usable CPUs // N`` torch /
  numba threads (set in the worker, not in the TrainConfig, so config hashes and resume are
  unchanged).
- ``scheduler``: a Dask distributed cluster: a scheduler address (``tcp://host:8786``, from
  ``dask scheduler`` plus ``dask worker`` processes on each machine, or dask-jobqueue on a
  batch system), a ``distributed.Client``, or ``"local"`` for a LocalCluster of ``workers``
  processes with one thread each. Each run uses ``usable CPUs // (workers on its host)``
  threads. The registry and the work folder must be on a file system every worker sees.
  Dask retries a task whose worker died on another worker.

Why Dask distributed and not Ray or submitit: it installs from PyPI as pure Python
(``pip install "tern[dist]"``), its LocalCluster gives tests, laptops and Kaggle the same
client API as a many-machine cluster, tasks are plain functions pickled with cloudpickle,
and a dying worker's task is rescheduled; Ray brings a heavier runtime (its own object
store and daemons, platform wheels) for what is only a task queue here, and submitit is a
SLURM job launcher (its local mode is subprocesses), not a pool a user can point at
machines they already have.

Runs on different thread counts may differ in the last float bits (torch matmul splits
change summation order); every row records its worker's pid, host and threads.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tern.core.config import param_counts
from tern.core.host_caches import usable_cpus
from tern.core.records import run_metadata
from tern.decide.registry import REGISTRY_SCHEMA, _jsonable, append_row

# `tern gate run --workers` default: on the 2-core reference host two single-thread runs
# side by side train 14.4k (e8) / 12.0k (e64) tok/s together against 11.4k / 9.4k for one
# two-thread run (capacity-gate models, medians of 15 steps, benchmarks/gate_train_speed.py)
DEFAULT_WORKERS = 2
AUTO_THREADS = -1  # Dask: usable CPUs // (workers on the run's host), decided in the worker


@dataclass(frozen=True)
class RunJob:
    """Everything one run needs, picklable: the planned run (tern.decide.harness.PlannedRun),
    where its row goes, and the runner."""

    gate: str
    gate_hash: str
    metric: str
    run: Any  # PlannedRun
    registry: str
    runner: Callable[..., dict]
    out_dir: str | None = None  # teachers: where the checkpoint goes
    teacher_checkpoint: str | None = None  # distillation arms
    teacher_cfg: Any = None
    progress: bool = False
    threads: int = 0  # 0: leave the process's defaults; AUTO_THREADS: per host (Dask)
    host_workers: tuple[tuple[str, int], ...] = ()  # Dask: (host, worker processes there)


def set_threads(n: int) -> None:
    """torch and numba threads of this process (numba capped at its pool size)."""
    import torch

    torch.set_num_threads(n)
    try:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except (ImportError, ValueError):  # pragma: no cover - numba missing or pool smaller
        pass


def _threads_here(job: RunJob) -> int:
    if job.threads != AUTO_THREADS:
        return job.threads
    return threads_per_worker(dict(job.host_workers).get(_host_ip(), 1))


def threads_per_worker(workers: int) -> int:
    """torch / numba threads of each of ``workers`` runs side by side on this host: the CPUs
    this process may use (its affinity, not the machine's count) shared out, at least 1."""
    return max(1, usable_cpus() // max(1, workers))


def _host_ip() -> str:
    try:
        from distributed import get_worker

        return get_worker().address.split("://")[-1].rsplit(":", 1)[0]
    except (ImportError, ValueError):
        return ""


def execute_run(job: RunJob) -> dict[str, Any]:
    """Train one run, append its row to the registry (locked), return the row."""
    run = job.run
    threads = _threads_here(job)
    if threads > 0:
        set_threads(threads)
    t0 = time.perf_counter()
    if run.distill:
        metrics = job.runner(run.model_cfg, run.train_cfg, teacher_checkpoint=Path(job.teacher_checkpoint),
                             teacher_cfg=job.teacher_cfg, distill=dict(run.distill), out_dir=None,
                             progress=job.progress)
    else:
        metrics = job.runner(run.model_cfg, run.train_cfg,
                             out_dir=Path(job.out_dir) if job.out_dir else None, progress=job.progress)
    wall_s = time.perf_counter() - t0
    metrics = _jsonable(metrics)
    if not isinstance(metrics, dict) or job.metric not in metrics:
        raise ValueError(f"runner returned no {job.metric!r} for {run.arm} seed {run.seed}: "
                         f"{sorted(metrics) if isinstance(metrics, dict) else metrics!r}")
    row = {"record": "gate_run", "schema": REGISTRY_SCHEMA, "gate": job.gate,
           "gate_hash": job.gate_hash, "arm": run.arm, "seed": run.seed, "role": run.role,
           "config_hash": run.config_hash, "metrics": metrics,
           "model_config": run.model_cfg.to_dict(), "train_config": _jsonable(run.train_cfg),
           "distill": run.distill, "counts": param_counts(run.model_cfg).summary(),
           "wall_s": wall_s, "run_metadata": run_metadata(threads if threads > 0 else None),
           "worker": {"pid": os.getpid(), "host": socket.gethostname(), "threads": threads or None}}
    append_row(job.registry, row)
    return row


def _init_pool_worker(threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(threads)
    die_with_parent()


def die_with_parent() -> bool:
    """Ask the kernel to SIGTERM this process when its parent exits (Linux ``prctl
    PR_SET_PDEATHSIG``): a pool worker whose driver was killed (``kill``, a closed
    terminal, a notebook kernel restart) then stops instead of training on as an orphan
    (its run has no row yet, so resume redoes it). Returns whether it took effect (False
    off Linux, where the pool's own shutdown is all there is)."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return os.getppid() != 1  # the parent may have died before the call


def run_jobs(jobs: Sequence[RunJob], *, workers: int = 1, scheduler: Any = None,
             on_row: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Execute ``jobs`` (module docstring) and return their rows in the order they
    finished; the first failure is raised after the runs already started have finished."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not jobs:
        return []
    report = on_row or (lambda row: None)
    if scheduler is not None:
        return _run_dask(jobs, scheduler, workers, report)
    if workers == 1:
        rows = []
        for j in jobs:
            rows.append(execute_run(j))
            report(rows[-1])
        return rows
    import multiprocessing as mp

    threads = threads_per_worker(workers)
    jobs = [_with(j, threads=threads) for j in jobs]
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=_init_pool_worker, initargs=(threads,)) as ex:
        pending = {ex.submit(execute_run, j) for j in jobs}
        try:
            while pending:
                # FIRST_COMPLETED: each run is reported as it finishes (FIRST_EXCEPTION
                # returned only when every run had finished, so a gate printed nothing for
                # the whole of a long run and looked stalled)
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                error = _take(finished, rows, report)
                if error is not None:  # let the runs already started finish (their rows count)
                    for p in pending:
                        p.cancel()
                    wait(pending)
                    _take({p for p in pending if not p.cancelled()}, rows, report)
                    raise error
        except KeyboardInterrupt:
            ex.shutdown(wait=False, cancel_futures=True)
            raise
    return rows


def _take(futures, rows: list[dict], report) -> BaseException | None:
    """Rows of the successful futures into ``rows``; the first error, if any."""
    error = None
    for f in futures:
        if f.exception() is None:
            rows.append(f.result())
            report(rows[-1])
        elif error is None:
            error = f.exception()
    return error


def _with(job: RunJob, **kw: Any) -> RunJob:
    return RunJob(**{**job.__dict__, **kw})


def _run_dask(jobs, scheduler, workers, report) -> list[dict]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ValueError("a Dask scheduler needs dask distributed: pip install 'tern[dist]' "
                         "(or 'dask[distributed]')") from None
    cluster = None
    if isinstance(scheduler, Client):
        client, own = scheduler, False
    elif scheduler == "local":
        cluster = LocalCluster(n_workers=workers, processes=True, threads_per_worker=1,
                               dashboard_address=None)
        client, own = Client(cluster), True
    else:
        client, own = Client(str(scheduler)), True
    try:
        hosts: dict[str, int] = {}  # worker processes per host (their threads share its cores)
        for w in client.scheduler_info()["workers"].values():
            hosts[w["host"]] = hosts.get(w["host"], 0) + 1
        jobs = [_with(j, threads=AUTO_THREADS, host_workers=tuple(hosts.items())) for j in jobs]
        futures = [client.submit(execute_run, j, pure=False,
                                 key=f"{j.gate}-{j.run.arm}-s{j.run.seed}-{j.run.config_hash[:8]}-{i}")
                   for i, j in enumerate(jobs)]
        rows = []
        for f in as_completed(futures):
            rows.append(f.result())  # a task's error is raised here
            report(rows[-1])
        return rows
    finally:
        if own:
            client.close()
        if cluster is not None:
            cluster.close()

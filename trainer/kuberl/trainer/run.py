"""A training run from start to end: start (or join) Ray while the learner builds, start the rollout
workers, run the learner's loop (`learner.py`), evaluate, report, and leave Ray as the caller needs.

`kuberl train` runs it locally; the learner pod runs the same function against the job's Ray head.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from kuberl.api.job import Device, RLTrainingJob, StopReason
from kuberl.api.learner_slots import extra_learners
from kuberl.trainer.accounting import Counters, publish_restored
from kuberl.trainer.envs.resolve import EnvNotFound
from kuberl.trainer.learner import Loop, checkpoint_when_due, evaluate, run_loop
from kuberl.trainer.log_tail import LogTail
from kuberl.trainer.metrics import JobLabels, LearnerMetrics
from kuberl.trainer.report import RunReport, Timeline
from kuberl.trainer.tracking import EXIT_WAIT_SECONDS, tracker_for
from kuberl.trainer.workers import WorkerSet, start_ray, stop_local_ray_after_exit

# torch (about 1 s to import) is imported by `_build_learner`, in a thread that runs while Ray starts.

log = logging.getLogger("kuberl.trainer")


@dataclass
class TrainOptions:
    """How to run a job here: the CLI's flags, and hooks for tests and benchmarks."""

    run_dir: Path | None = None
    resume: bool = False
    workers: int | None = None
    ray_address: str | None = None
    # A driver joining a cluster from elsewhere (`kuberl train --ray-address` on a laptop) hands its import
    # path to the cluster's workers (a user's env module beside the job file). A learner pod does not: every
    # node of the job runs the learner's image, and a runtime_env makes Ray start a fresh worker process for
    # each actor where a pre-started one would do.
    ship_import_path: bool = True
    metrics_port: int | None = None
    progress: bool = True
    max_env_steps: int | None = None
    seed: int | None = None
    device: str | None = None
    shutdown_ray: bool = True
    started_at: float | None = None  # time.perf_counter() at process start (the CLI gives it); else train()'s start
    exit_after: bool = False  # the caller ends the process right after: its embedded Ray goes with it
    on_iteration: Callable[[dict[str, Any], Any], None] | None = None  # (row, loop): tests and benchmarks observe
    tracking_parent: str | None = None  # a sweep's MLflow run: this run is one of its children


@dataclass
class TrainResult:
    """How a run ended: why, its counters, its last mean return and its final evaluation."""

    ok: bool
    reason: str
    counters: Counters
    mean_return: float | None
    evaluation: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None
    ray_start_seconds: float = 0.0
    metrics_port: int | None = None
    solved_at_seconds: float | None = None
    time_split: dict[str, Any] = field(default_factory=dict)  # seconds per phase, summing to the wall clock


def pick_device(requested: str):
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("spec.learner.device is cuda but torch sees no CUDA device")
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def train(job: RLTrainingJob, options: TrainOptions | None = None) -> TrainResult:
    """Train `job` until a stopping rule says stop: start-up, the learner's loop, evaluation and report,
    then teardown (which leaves Ray as `options` asks)."""
    options = options or TrainOptions()
    timeline = Timeline(options.started_at)
    run, builder = _prepare(job, options)
    try:
        loop, ray_seconds = _start(run, builder, timeline)
        result = _train_and_evaluate(run, loop, ray_seconds, timeline)
    except BaseException as err:
        # A failed run stops its Ray the orderly way below: its caller goes on (to report the error),
        # it does not leave by os._exit. An unexpected error is logged here first, with its traceback,
        # in case Ray's teardown ends the process before the error reaches the caller.
        run.failed = True
        if not isinstance(err, (KeyboardInterrupt, SystemExit, RuntimeError, TimeoutError, ConnectionError,
                                EnvNotFound)):
            log.exception("training failed")
        if run.report.tracker is not None:
            run.report.tracker.close("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED",
                                     wait=EXIT_WAIT_SECONDS)
        _keep_record(run)
        raise
    finally:
        _teardown(run)
    timeline.mark("shutdown")
    run.report.final(timeline)  # summary.json gets the shutdown too; then the summary table
    _keep_record(run)
    result.time_split = timeline.as_dict()
    _close_tracker(run, result)
    return result


def _keep_record(run: _Run) -> None:
    """The learner's last log lines, and summary.json when the run wrote one, to the object store: a new
    log file per learner process (a restarted one adds its own), the summary the newest."""
    if run.log_tail is None:
        return
    run.log_tail.detach()
    if run.store is None:  # the store never opened (refused, unreachable): nowhere to keep them
        return
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    files = {f"logs/learner-{stamp}-{os.getpid()}.log": run.log_tail.text()}
    summary = run.run_dir / "summary.json"
    if summary.is_file():
        files["summary.json"] = summary.read_bytes()
    run.store.keep_record(files)


def _close_tracker(run: _Run, result: TrainResult) -> None:
    """The exported policy to the tracker, and the run ended there (or, stopped by SIGTERM, left to the
    learner that resumes it)."""
    tracker = run.report.tracker
    if tracker is None:
        return
    if result.reason == StopReason.SIGNAL.value:
        tracker.close("KILLED", wait=EXIT_WAIT_SECONDS)
        return
    import tempfile

    from kuberl.trainer.serving.export import ExportError, export

    with tempfile.TemporaryDirectory(prefix="kuberl-policy-") as tmp:
        try:
            out = export(run.run_dir, Path(tmp) / "policy")
            tracker.log_files(out, sorted(p.name for p in out.iterdir()), under="policy/")
        except (ExportError, OSError, ValueError) as err:  # no checkpoint (checkpointing disabled), say
            log.info("no policy for the tracker: %s", err)
    tracker.close("FINISHED")


@dataclass
class _Run:
    """What train()'s start-up, loop and teardown share."""

    job: RLTrainingJob
    options: TrainOptions
    run_dir: Path
    cluster: bool  # joined a Ray cluster (a learner pod), not an embedded Ray
    replicas: int
    report: RunReport
    metrics: LearnerMetrics
    metrics_port: int | None
    stop_signal: dict[str, bool] = field(default_factory=lambda: {"set": False})
    workers: WorkerSet | None = None
    learners: Any = None  # ddp.LearnerGroup, with spec.learner.replicas > 1
    reason: str | None = None  # why training stopped, once it has
    failed: bool = False
    previous_term: Any = None  # the SIGTERM handler to put back
    store: Any = None  # spec.checkpointing.s3's ObjectCheckpoints, once the learner is built
    log_tail: LogTail | None = None  # the last log lines, for the store's record of the run

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"


def _prepare(job: RLTrainingJob, options: TrainOptions) -> tuple[_Run, _Background]:
    """Before Ray: the options applied to the spec, the run directory, the learner building in a
    thread, the report and the metrics server."""
    spec = job.spec
    if options.max_env_steps is not None:
        spec.stopping.max_env_steps = options.max_env_steps
    if options.seed is not None:
        spec.seed = options.seed
    if options.device is not None:
        spec.learner.device = Device(options.device)
    if options.workers is not None:
        spec.rollout_workers.replicas = options.workers
    run_dir = Path(options.run_dir or Path("runs") / job.metadata.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = bool(options.ray_address)
    replicas = spec.rollout_workers.replicas
    # Ray starts next, in this thread (its processes die with the thread that starts them), while a
    # second thread imports torch, checks the environment, builds the networks and loads a checkpoint.
    builder = _Background(_build_learner, spec, cluster, replicas, run_dir / "checkpoints" if options.resume else None)
    report = RunReport(run_dir, job, progress=options.progress,
                       tracker=tracker_for(job, run_dir, resume=options.resume, parent_run_id=options.tracking_parent))
    labels = JobLabels(job.metadata.name, job.metadata.namespace, spec.algorithm.name.value, spec.environment.id)
    metrics = LearnerMetrics(labels)
    metrics_port = None
    if spec.metrics.enabled:
        port = spec.metrics.port if options.metrics_port is None else options.metrics_port
        try:
            metrics_port = metrics.serve(port, addr="0.0.0.0" if cluster else "127.0.0.1")
        except OSError as err:
            builder.result()
            raise RuntimeError(f"cannot serve metrics on port {port} ({err.strerror}): set spec.metrics.port, "
                               "pass --metrics-port 0 for a free port, or spec.metrics.enabled: false") from None
        log.info("metrics on http://%s:%d/metrics", "0.0.0.0" if cluster else "127.0.0.1", metrics_port)
    log_tail = LogTail().attach() if spec.checkpointing.s3 is not None else None
    return _Run(job, options, run_dir, cluster, replicas, report, metrics, metrics_port, log_tail=log_tail), builder


def _start(run: _Run, builder: _Background, timeline: Timeline) -> tuple[Loop, float]:
    """Ray (started or joined), the learner, the report's files, the rollout workers: the loop, ready."""
    spec, options = run.job.spec, run.options
    try:
        ray_seconds = start_ray(options.ray_address, run.replicas, extra_learners(spec.learner.replicas),
                                ship_import_path=options.ship_import_path)
    finally:
        learner = builder.result()  # its errors (a bad env, a corrupt state) first: they say more
    run.store = learner.store
    # After Ray: ray.init installs its own SIGTERM handler (sys.exit), and its core worker a C++
    # one over that, so a handler set earlier is gone and a deleted learner pod died mid-iteration
    # without its exit checkpoint (seen on real containers: one checkpoint interval lost).
    if _main_thread():
        run.previous_term = signal.signal(signal.SIGTERM, _sigterm_handler(run.stop_signal))
    log.info("ray %s in %.2fs", "joined" if run.cluster else "started", ray_seconds)
    algo, counters = learner.algo, learner.counters
    if spec.learner.replicas > 1:
        run.learners = _start_learners(run, algo)
    run.report.open(resumed=counters.iterations > 0, env_steps=counters.env_steps,
                    iteration=counters.iterations)
    publish_restored(run.metrics, counters, run.replicas)
    env_spec = spec.environment
    worker_args = {
        "env_id": env_spec.id, "env_kwargs": env_spec.kwargs, "num_envs": spec.rollout_workers.envs_per_worker,
        "policy": algo.policy_config(), "max_episode_steps": env_spec.max_episode_steps,
        "record_steps": algo.records_steps,
        "multi_agent": None if env_spec.multi_agent is None else env_spec.multi_agent.model_dump(),
    }
    algo.attach_run_dir(run.run_dir)
    run.workers = WorkerSet(worker_args, None if run.cluster else run.replicas, run.cluster,
                            spec.seed + 17 * counters.iterations, expected=run.replicas,
                            stop=lambda: run.stop_signal["set"])
    # The loop's clock starts here: a run's wall clock includes starting its rollout workers.
    loop = Loop(run.job, algo, run.workers, run.metrics, run.report, counters, learner.recent_returns,
                run.ckpt_dir, run.stop_signal, options.on_iteration, run.learners, store=learner.store)
    run.workers.reconcile(wait_for_all=60.0)
    log.info("%d/%d rollout workers ready", len(run.workers.ready()), run.replicas)
    timeline.mark("startup", ray=ray_seconds, learner_build=learner.seconds, imports=learner.import_seconds)
    return loop, ray_seconds


def _start_learners(run: _Run, algo: Any) -> Any:
    """Ranks 1..N-1 of `spec.learner.replicas`, joined with this process (rank 0)."""
    import torch

    from kuberl.trainer.ddp import LearnerGroup

    # Locally the learners share this machine's cores (`_build_learner` gave rank 0 its share); on a
    # cluster each learner pod has its own, as many as rank 0 sees unless spec.learner.threads says.
    threads = run.job.spec.learner.threads or (None if run.cluster else torch.get_num_threads())
    return LearnerGroup.start(run.job.spec, algo, run.cluster, threads)


def _sigterm_handler(stop_signal: dict[str, bool]) -> Callable[[int, Any], None]:
    """Sets `stop_signal`: the loop stops after its iteration, and the run checkpoints and leaves."""

    def on_term(signum, frame) -> None:  # a pod being deleted: checkpoint and leave cleanly
        if not stop_signal["set"]:
            log.warning("SIGTERM received: checkpointing and stopping")
        stop_signal["set"] = True

    return on_term


def _train_and_evaluate(run: _Run, loop: Loop, ray_seconds: float, timeline: Timeline) -> TrainResult:
    """The loop, then (unless SIGTERM stopped it) the evaluation, the final checkpoint and the report."""
    counters, metrics, report = loop.counters, run.metrics, run.report
    wait_before = counters.learner_wait
    run.reason = reason = run_loop(loop)
    log.info("training stopped: %s", reason)
    metrics.set_stopped_by(reason)
    timeline.mark_split("collection", counters.learner_wait - wait_before, "learning")
    report.training_done()  # the learning curve is drawn in the background while the workers evaluate
    if reason == "signal":
        # SIGTERM: the pod is being deleted (kubectl delete, suspend, a new Ray head) and its rollout
        # workers with it. Training is not over: save it and leave within the grace period; an
        # evaluation here would outlive the workers, fail, and lose the checkpoint.
        checkpoint_when_due(loop, force=True)
        if run.job.spec.checkpointing.enabled:
            # Said at the default level: what the replacement resumes from, and a post-mortem's anchor.
            from kuberl.trainer.checkpoint import checkpoint_path
            log.warning("stopped by SIGTERM: iteration %d is in %s", loop.last_ckpt_iter,
                        checkpoint_path(loop.ckpt_dir, loop.last_ckpt_iter).name)
        evaluation = {}
    else:
        evaluation = evaluate(loop) if run.job.spec.evaluation.enabled else {}
        timeline.mark("evaluation")
        checkpoint_when_due(loop, force=True)
        metrics.set("kuberl_job_finished", 1)
    mean_return = float(np.mean(loop.recent_returns)) if loop.recent_returns else None
    report.finish(counters.as_dict(), mean_return, evaluation, reason, ray_seconds, timeline)
    metrics.write_termination_message()
    timeline.mark("report")
    return TrainResult(True, reason, counters, mean_return, evaluation, run.run_dir, ray_seconds,
                       run.metrics_port, loop.solved_at)


def _teardown(run: _Run) -> None:
    """The report closed, the workers stopped, Ray stopped or left to die with the process, and the
    SIGTERM handler put back; whether the run succeeded, failed or was stopped by SIGTERM."""
    run.report.close()
    # A learner pod stopped by SIGTERM (deleted, suspended, a new Ray head) leaves its cluster as it
    # is: the head may be gone already, and every Ray call would wait on it past the grace period.
    leaving = run.cluster and run.reason == "signal"
    if run.workers is not None and not leaving:
        run.workers.shutdown()
    if run.learners is not None:
        run.learners.shutdown(stop_actors=not leaving)
    if run.options.exit_after and not run.cluster and not run.failed and stop_local_ray_after_exit():
        pass  # the process exits next; the metrics server's thread goes with it
    else:
        run.metrics.close()
        if run.options.shutdown_ray and not leaving:
            ray.shutdown()
    if run.previous_term is not None:
        signal.signal(signal.SIGTERM, run.previous_term)


@dataclass
class _Learner:
    algo: Any
    counters: Counters
    recent_returns: collections.deque
    seconds: float
    import_seconds: float
    store: Any = None  # spec.checkpointing.s3's ObjectCheckpoints


def _build_learner(spec, cluster: bool, replicas: int, resume_dir: Path | None) -> _Learner:
    """Everything the learner needs before it can train, none of which needs Ray: torch, the
    environment's spaces, the algorithm and its networks, the checkpoint to continue from."""
    t0 = time.perf_counter()
    import torch

    from kuberl.trainer import checkpoint as ckpt
    from kuberl.trainer.algorithms import algorithm_for_env
    from kuberl.trainer.threads import container_cpus, size_threads

    import_seconds = time.perf_counter() - t0
    device = pick_device(spec.learner.device.value)
    if spec.learner.threads:
        torch.set_num_threads(spec.learner.threads)
    elif device.type == "cpu" and cluster:
        # A learner pod computes with its container's CPUs, not the node's (kuberl.trainer.threads).
        size_threads()
    elif device.type == "cpu":
        # Rollout workers share this machine's cores; a learner that grabs them all slows everyone.
        torch.set_num_threads(max(1, ((os.cpu_count() or 1) - replicas) // spec.learner.replicas))
    log.info("torch threads: %d (container CPUs: %d)", torch.get_num_threads(), container_cpus())
    torch.manual_seed(spec.seed)
    algo = algorithm_for_env(spec, device, spec.seed, spec.stopping.max_env_steps)
    counters = Counters()
    recent_returns: collections.deque[float] = collections.deque(maxlen=spec.stopping.return_window)
    store = _open_store(spec)
    loaded: tuple[Any, dict[str, Any]] | None = None
    if store is not None:
        # The store is the run's record: a learner resumes from it whether or not its disk survived.
        loaded = _load_from_store(spec, store, device)
    elif resume_dir is not None:
        local = ckpt.load_latest(resume_dir, map_location=device)
        if local is None:
            log.info("no loadable checkpoint in %s; starting fresh", resume_dir)
        else:
            loaded = local[0].name, local[1]
    if loaded is not None:
        where, state = loaded
        algo.load_state_dict(state["algorithm"])
        counters = Counters(**{k: type(getattr(Counters(), k))(v) for k, v in state["counters"].items()})
        recent_returns.extend(float(x) for x in state["recent_returns"].tolist())
        torch.set_rng_state(state["torch_rng"])
        log.info("resumed from %s: iteration %d, %d env steps, %d episodes",
                 where, counters.iterations, counters.env_steps, counters.episodes)
    return _Learner(algo, counters, recent_returns, time.perf_counter() - t0, import_seconds, store)


def _open_store(spec) -> Any:
    """spec.checkpointing.s3's store (kuberl.trainer.checkpoint_store), or None without one."""
    s3 = spec.checkpointing.s3
    if s3 is None:
        return None
    from kuberl.trainer.checkpoint_store import ObjectCheckpoints

    return ObjectCheckpoints.open(s3.uri, s3.endpoint, s3.region, "spec.checkpointing.s3.uri")


def _load_from_store(spec, store: Any, device: Any) -> tuple[str, dict[str, Any]] | None:
    """The newest complete checkpoint at the run's path, else at resumeFrom; None (fresh) when neither has one.
    Listing the path first also tries the credentials before any training is done."""
    from kuberl.trainer.checkpoint_store import ObjectCheckpoints
    from kuberl.trainer.object_store import ObjectStoreError

    s3 = spec.checkpointing.s3
    sources = [store]
    if s3.resume_from is not None:
        sources.append(ObjectCheckpoints.open(s3.resume_from, s3.endpoint, s3.region,
                                              "spec.checkpointing.s3.resumeFrom"))
    for source in sources:
        try:
            found = source.load_latest(map_location=device)
        except ObjectStoreError as err:  # CheckpointStoreRefused is no ObjectStoreError: it goes on up
            raise ObjectStoreError(f"cannot read the checkpoints at {source.uri} ({err}): starting fresh could "
                                   "overwrite them, so the learner stops here (a pod is retried)") from None
        if found is not None:
            return found[0].where, found[1]
        log.info("no complete checkpoint at %s", source.uri)
    return None


class _Background:
    """`fn(*args)` in a thread; `result()` waits and returns it, or raises what it raised."""

    def __init__(self, fn: Callable[..., Any], *args: Any):
        import threading

        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args)
            except BaseException as err:  # noqa: BLE001 - handed to the caller by result()
                self._error = err

        self._thread = threading.Thread(target=run, name=fn.__name__, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()

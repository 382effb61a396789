"""The learner loop: start (or join) Ray, keep rollout workers, learn, measure, checkpoint, stop, evaluate.

`kuberl train` runs it locally; the learner pod runs the same function against the job's Ray head.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import ray

from kuberl.api.job import CollectionMode, Device, RLTrainingJob
from kuberl.trainer.metrics import JobLabels, LearnerMetrics
from kuberl.trainer.report import RunReport, Timeline
from kuberl.trainer.workers import WorkerSet, start_ray, stop_local_ray_after_exit

# torch (about 1 s to import) is imported by `_build_learner`, in a thread that runs while Ray starts.

log = logging.getLogger("kuberl.trainer")


@dataclass
class TrainOptions:
    run_dir: Path | None = None
    resume: bool = False
    workers: int | None = None
    ray_address: str | None = None
    metrics_port: int | None = None
    progress: bool = True
    max_env_steps: int | None = None
    seed: int | None = None
    device: str | None = None
    shutdown_ray: bool = True
    started_at: float | None = None  # time.perf_counter() at process start (the CLI gives it); else train()'s start
    exit_after: bool = False  # the caller ends the process right after: its embedded Ray goes with it
    on_iteration: Callable[[dict[str, Any], Any], None] | None = None  # (row, loop): tests and benchmarks observe


@dataclass
class Counters:
    """Everything that must survive a restart to continue, not restart, a run."""

    iterations: int = 0
    env_steps: int = 0
    episodes: int = 0
    gradient_updates: int = 0
    wall_clock: float = 0.0
    worker_restarts: int = 0
    checkpoints: int = 0
    learner_wait: float = 0.0
    worker_wait: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class TrainResult:
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


class _RateWindow:
    """Episodes/s and steps/s over the last few seconds (not since start: a user wants current speed)."""

    def __init__(self, seconds: float = 5.0):
        self.seconds = seconds
        self.points: collections.deque = collections.deque()

    def add(self, t: float, episodes: int, steps: int) -> tuple[float, float]:
        self.points.append((t, episodes, steps))
        while len(self.points) > 2 and t - self.points[1][0] >= self.seconds:
            self.points.popleft()
        t0, e0, s0 = self.points[0]
        dt = t - t0
        if dt <= 0:
            return 0.0, 0.0
        return (episodes - e0) / dt, (steps - s0) / dt


def train(job: RLTrainingJob, options: TrainOptions | None = None) -> TrainResult:
    options = options or TrainOptions()
    timeline = Timeline(options.started_at)
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
    ckpt_dir = run_dir / "checkpoints"

    # Ray starts here, in this thread (its processes die with the thread that starts them), while a
    # second thread imports torch, checks the environment, builds the networks and loads a checkpoint.
    builder = _Background(_build_learner, spec, cluster, replicas, ckpt_dir if options.resume else None)
    report = RunReport(run_dir, job, progress=options.progress)
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

    stop_signal = {"set": False}

    def _on_term(signum, frame):  # a pod being deleted: checkpoint and leave cleanly
        if not stop_signal["set"]:
            log.warning("SIGTERM received: checkpointing and stopping")
        stop_signal["set"] = True

    previous_term = None
    workers = None
    reason = None
    failed = False
    try:
        try:
            ray_seconds = start_ray(options.ray_address, replicas)
        finally:
            learner = builder.result()  # its errors (a bad env, a corrupt state) first: they say more
        # After Ray: ray.init installs its own SIGTERM handler (sys.exit), and its core worker a C++
        # one over that, so a handler set earlier is gone and a deleted learner pod died mid-iteration
        # without its exit checkpoint (seen on real containers: one checkpoint interval lost).
        if _main_thread():
            previous_term = signal.signal(signal.SIGTERM, _on_term)
        log.info("ray %s in %.2fs", "joined" if cluster else "started", ray_seconds)
        algo, counters, recent_returns = learner.algo, learner.counters, learner.recent_returns
        report.open(resumed=counters.iterations > 0)
        # Counters continue across restarts: start them at the checkpoint's values.
        metrics.inc("kuberl_episodes_total", counters.episodes)
        metrics.inc("kuberl_env_steps_total", counters.env_steps)
        metrics.inc("kuberl_gradient_updates_total", counters.gradient_updates)
        metrics.inc("kuberl_iterations_total", counters.iterations)
        metrics.inc("kuberl_rollout_worker_restarts_total", counters.worker_restarts)
        metrics.inc("kuberl_checkpoints_total", counters.checkpoints)
        metrics.inc("kuberl_learner_wait_seconds_total", counters.learner_wait)
        metrics.inc("kuberl_worker_weight_wait_seconds_total", counters.worker_wait)
        metrics.set("kuberl_rollout_workers_desired", replicas)

        env_spec = spec.environment
        worker_args = {
            "env_id": env_spec.id, "env_kwargs": env_spec.kwargs, "num_envs": spec.rollout_workers.envs_per_worker,
            "policy": algo.policy_config(), "max_episode_steps": env_spec.max_episode_steps,
        }
        workers = WorkerSet(worker_args, None if cluster else replicas, cluster, spec.seed + 17 * counters.iterations,
                            expected=replicas)
        loop = _Loop(job, algo, workers, metrics, report, counters, recent_returns, ckpt_dir, options, stop_signal)
        workers.reconcile(wait_for_all=60.0)
        log.info("%d/%d rollout workers ready", len(workers.ready()), replicas)
        timeline.mark("startup", ray=ray_seconds, learner_build=learner.seconds, imports=learner.import_seconds)
        wait_before = counters.learner_wait
        reason = loop.run()
        log.info("training stopped: %s", reason)
        collected = counters.learner_wait - wait_before
        timeline.mark_split("collection", collected, "learning")
        report.training_done()  # the learning curve is drawn in the background while the workers evaluate
        if reason == "signal":
            # SIGTERM: the pod is being deleted (kubectl delete, suspend, a new Ray head) and its rollout
            # workers with it. Training is not over: save it and leave within the grace period; an
            # evaluation here would outlive the workers, fail, and lose the checkpoint.
            loop.checkpoint(force=True)
            evaluation = {}
        else:
            evaluation = loop.evaluate() if spec.evaluation.enabled else {}
            timeline.mark("evaluation")
            loop.checkpoint(force=True)
            metrics.set("kuberl_job_finished", 1)
        mean_return = float(np.mean(recent_returns)) if recent_returns else None
        report.finish(counters.as_dict(), mean_return, evaluation, reason, ray_seconds, timeline)
        metrics.write_termination_message()
        timeline.mark("report")
        result = TrainResult(True, reason, counters, mean_return, evaluation, run_dir, ray_seconds,
                             metrics_port, loop.solved_at)
    except BaseException as err:
        # A failed run stops its Ray the orderly way below: its caller goes on (to report the error),
        # it does not leave by os._exit. An unexpected error is logged here first, with its traceback,
        # in case Ray's teardown ends the process before the error reaches the caller.
        failed = True
        if not isinstance(err, (KeyboardInterrupt, SystemExit, RuntimeError, TimeoutError, ConnectionError)):
            log.exception("training failed")
        raise
    finally:
        report.close()
        # A learner pod stopped by SIGTERM (deleted, suspended, a new Ray head) leaves its cluster as it
        # is: the head may be gone already, and every Ray call would wait on it past the grace period.
        leaving = cluster and reason == "signal"
        if workers is not None and not leaving:
            workers.shutdown()
        if options.exit_after and not cluster and not failed and stop_local_ray_after_exit():
            pass  # the process exits next; the metrics server's thread goes with it
        else:
            metrics.close()
            if options.shutdown_ray and not leaving:
                ray.shutdown()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    timeline.mark("shutdown")
    report.final(timeline)  # summary.json gets the shutdown too; then the summary table
    result.time_split = timeline.as_dict()
    return result


@dataclass
class _Learner:
    algo: Any
    counters: Counters
    recent_returns: collections.deque
    seconds: float
    import_seconds: float


def _build_learner(spec, cluster: bool, replicas: int, resume_dir: Path | None) -> _Learner:
    """Everything the learner needs before it can train, none of which needs Ray: torch, the
    environment's spaces, the algorithm and its networks, the checkpoint to continue from."""
    t0 = time.perf_counter()
    import torch

    from kuberl.trainer import checkpoint as ckpt
    from kuberl.trainer.algorithms import algorithm_for
    from kuberl.trainer.rollout import make_env
    from kuberl.trainer.spaces import space_info

    import_seconds = time.perf_counter() - t0
    device = pick_device(spec.learner.device.value)
    if spec.learner.threads:
        torch.set_num_threads(spec.learner.threads)
    elif device.type == "cpu" and not cluster:
        # Rollout workers share this machine's cores; a learner that grabs them all slows everyone.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) - replicas))
    torch.manual_seed(spec.seed)
    env_spec = spec.environment
    probe = make_env(env_spec.id, env_spec.kwargs, env_spec.max_episode_steps)
    info = space_info(probe.observation_space, probe.action_space)
    probe.close()
    algo = algorithm_for(spec, info, device, spec.seed, spec.stopping.max_env_steps)
    counters = Counters()
    recent_returns: collections.deque[float] = collections.deque(maxlen=spec.stopping.return_window)
    if resume_dir is not None:
        loaded = ckpt.load_latest(resume_dir, map_location=device)
        if loaded is None:
            log.info("no loadable checkpoint in %s; starting fresh", resume_dir)
        else:
            path, state = loaded
            algo.load_state_dict(state["algorithm"])
            counters = Counters(**{k: type(getattr(Counters(), k))(v) for k, v in state["counters"].items()})
            recent_returns.extend(float(x) for x in state["recent_returns"].tolist())
            torch.set_rng_state(state["torch_rng"])
            log.info("resumed from %s: iteration %d, %d env steps, %d episodes",
                     path.name, counters.iterations, counters.env_steps, counters.episodes)
    return _Learner(algo, counters, recent_returns, time.perf_counter() - t0, import_seconds)


class _Background:
    """`fn(*args)` in a thread; `result()` waits and returns it, or raises what it raised."""

    def __init__(self, fn: Callable[..., Any], *args: Any):
        import threading

        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args)
            except BaseException as err:  # handed to the caller by result()
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


class _Loop:
    """One training run's iterations. Kept as a class so sync and async collection share the bookkeeping."""

    def __init__(self, job, algo, workers, metrics, report, counters, recent_returns, ckpt_dir, options, stop_signal):
        self.job, self.spec = job, job.spec
        self.algo, self.workers, self.metrics, self.report = algo, workers, metrics, report
        self.c, self.recent_returns, self.ckpt_dir = counters, recent_returns, ckpt_dir
        self.options, self.stop_signal = options, stop_signal
        self.rates = _RateWindow()
        self.start = time.perf_counter() - counters.wall_clock
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_iter = counters.iterations
        self.weights_ref = None
        self.weights_version = -1
        self.solved_at: float | None = None
        self.last_loss = float("nan")
        self.base_restarts = counters.worker_restarts
        self.reported_wait = counters.learner_wait

    # ---- weights: one ray.put per iteration, shared by every worker ---------------------------------

    def publish_weights(self) -> None:
        version = self.algo.gradient_updates
        if version != self.weights_version or self.weights_ref is None:
            self.weights_ref = ray.put(self.algo.weights())
            self.weights_version = version

    # ---- the loop --------------------------------------------------------------------------------

    def run(self) -> str:
        if self.spec.collection.mode == CollectionMode.ASYNC:
            return self._run_async()
        return self._run_sync()

    def _sample_args(self) -> tuple:
        if self.algo.on_policy:
            return (self.weights_ref, self.weights_version, self.algo.cfg.rollout_steps, self.algo.cfg.gamma)
        eps = self.algo.exploration(self.c.env_steps)
        return (self.weights_ref, self.weights_version, self.spec.collection.fragment_steps, eps,
                self.algo.cfg.gamma, getattr(self.algo.cfg, "n_step", 1))

    def _method(self) -> str:
        return "sample_onpolicy" if self.algo.on_policy else "sample_offpolicy"

    def _run_sync(self) -> str:
        while True:
            reason = self.should_stop()
            if reason:
                return reason
            self.workers.reconcile()
            self.publish_weights()
            args = self._sample_args()
            t_wait = time.perf_counter()
            batches = list(self.workers.call(self._method(), {h.index: args for h in self.workers.ready()},
                                             stop=lambda: self.stop_signal["set"]).values())
            self.c.learner_wait += time.perf_counter() - t_wait
            if not batches or self.stop_signal["set"]:
                continue  # SIGTERM: this round is dropped whole; the checkpoint keeps the last iteration
            self._learn_and_account(batches)

    def _run_async(self) -> str:
        """Workers keep up to `queueSize` batches each in flight and step their envs while the learner
        trains on whichever batch is done first.

        `maxStaleness` bounds the policy a worker collects with: the learner applies an update only while
        every batch still being collected (handed out, not finished) was sent weights at most that many
        updates older. Updates the bound holds back stay owed (the algorithm applies them on a later
        call, so trainFrequency's replay ratio holds) and no new batch is handed out until they are
        applied. A finished batch is replay data like any other and holds nothing back.
        """
        col = self.spec.collection
        inflight: dict[Any, tuple[int, int]] = {}  # ref -> (worker index, weights version it was sent)

        def submit(handle) -> None:
            ref = getattr(handle.actor, self._method()).remote(*self._sample_args())
            inflight[ref] = (handle.index, self.weights_version)

        def collecting_versions() -> list[int]:
            if not inflight:
                return []
            _, running = ray.wait(list(inflight), num_returns=len(inflight), timeout=0)
            return [inflight[ref][1] for ref in running]

        while True:
            reason = self.should_stop()
            if reason:
                break
            self.workers.reconcile(wait_for_one=not inflight)
            self.publish_weights()
            if not inflight or not getattr(self.algo, "updates_held_back", 0):
                busy = collections.Counter(idx for idx, _ in inflight.values())
                for handle in self.workers.ready():
                    for _ in range(col.queue_size - busy[handle.index]):
                        submit(handle)
            t_wait = time.perf_counter()
            done, _ = ray.wait(list(inflight), num_returns=1, timeout=5.0)
            self.c.learner_wait += time.perf_counter() - t_wait
            batches = []
            for ref in done:
                index, _version = inflight.pop(ref)
                got = self.workers.gather({index: ref})
                if index in got:
                    batches.append(got[index])
                else:  # its other in-flight calls died with it
                    for other in [r for r, (i, _) in inflight.items() if i == index]:
                        inflight.pop(other)
            if not batches:
                continue
            collecting = collecting_versions()
            oldest = min(collecting, default=None)
            budget = None if oldest is None else max(col.max_staleness - (self.algo.gradient_updates - oldest), 0)
            self._learn_and_account(batches, max_updates=budget)
            self.metrics.set("kuberl_policy_staleness_updates",
                             0 if oldest is None else self.algo.gradient_updates - oldest)
        for ref in list(inflight):
            ray.cancel(ref, force=False)
        return reason

    def _learn_and_account(self, batches: list[dict[str, Any]], max_updates: int | None = None) -> None:
        new_steps = sum(int(b["env_steps"]) for b in batches)
        self.c.env_steps += new_steps
        returns = np.concatenate([b["episode_returns"] for b in batches]) if batches else np.zeros(0)
        worker_wait = sum(float(b.get("idle_seconds", 0.0)) for b in batches)
        kwargs = {} if max_updates is None or self.algo.on_policy else {"max_updates": max_updates}
        stats = self.algo.learn(batches, self.c.env_steps, **kwargs)
        self.c.iterations += 1
        self.c.episodes += len(returns)
        self.recent_returns.extend(float(r) for r in returns)
        self.c.gradient_updates += stats.gradient_updates
        self.c.worker_wait += worker_wait
        restarts = self.base_restarts + self.workers.restarts
        new_restarts, self.c.worker_restarts = restarts - self.c.worker_restarts, restarts
        new_wait, self.reported_wait = self.c.learner_wait - self.reported_wait, self.c.learner_wait
        now = time.perf_counter()
        self.c.wall_clock = now - self.start
        eps_rate, step_rate = self.rates.add(now, self.c.episodes, self.c.env_steps)
        mean_return = float(np.mean(self.recent_returns)) if self.recent_returns else None
        if not math.isnan(stats.loss):
            self.last_loss = stats.loss

        # What needs Ray (a cluster's slot count asks its head) comes first, then the row, then the
        # metrics: a learner that dies here (its head gone) must not have published an iteration that
        # metrics.jsonl and its checkpoint never saw, or status.progress would go back on its restart.
        ready, desired = len(self.workers.ready()), self.workers.desired()
        row = {"iteration": self.c.iterations, "env_steps": self.c.env_steps, "episodes": self.c.episodes,
               "wall_clock": round(self.c.wall_clock, 4), "mean_return": mean_return,
               "episodes_per_second": eps_rate, "env_steps_per_second": step_rate, "loss": stats.loss,
               "gradient_updates": self.c.gradient_updates, "workers_ready": ready,
               "worker_nodes": len({b.get("node") for b in batches}),
               "learner_wait": self.c.learner_wait, "worker_wait": self.c.worker_wait, **stats.extra}
        self.report.iteration(row)

        m = self.metrics
        m.inc("kuberl_episodes_total", len(returns))
        m.inc("kuberl_env_steps_total", new_steps)
        m.inc("kuberl_gradient_updates_total", stats.gradient_updates)
        m.inc("kuberl_iterations_total", 1)
        m.set("kuberl_episodes_per_second", eps_rate)
        m.set("kuberl_env_steps_per_second", step_rate)
        m.set("kuberl_training_wall_clock_seconds", self.c.wall_clock)
        if mean_return is not None:
            m.set("kuberl_episode_return_mean", mean_return)
        m.set("kuberl_rollout_workers_ready", ready)
        m.set("kuberl_rollout_workers_desired", desired)
        m.inc("kuberl_rollout_worker_restarts_total", new_restarts)
        if not math.isnan(self.last_loss):
            m.set("kuberl_learner_loss", self.last_loss)
        m.inc("kuberl_learner_wait_seconds_total", new_wait)
        m.inc("kuberl_worker_weight_wait_seconds_total", worker_wait)
        if self.options.on_iteration is not None:
            self.options.on_iteration(row, self)
        self.checkpoint()

    def should_stop(self) -> str | None:
        st = self.spec.stopping
        if self.stop_signal["set"]:
            return "signal"
        if (st.target_return is not None and len(self.recent_returns) >= st.return_window
                and float(np.mean(self.recent_returns)) >= st.target_return):
            if self.solved_at is None:
                self.solved_at = self.c.wall_clock
            return "target_return"
        if st.max_env_steps is not None and self.c.env_steps >= st.max_env_steps:
            return "max_env_steps"
        if st.max_episodes is not None and self.c.episodes >= st.max_episodes:
            return "max_episodes"
        if st.max_wall_clock_seconds is not None and time.perf_counter() - self.start >= st.max_wall_clock_seconds:
            return "max_wall_clock_seconds"
        return None

    # ---- checkpoints -----------------------------------------------------------------------------

    def checkpoint(self, force: bool = False) -> None:
        import torch

        from kuberl.trainer import checkpoint as ckpt

        cfg = self.spec.checkpointing
        if not cfg.enabled:
            return
        due = force
        if cfg.interval_iterations and self.c.iterations - self.last_ckpt_iter >= cfg.interval_iterations:
            due = True
        if cfg.interval_seconds and time.monotonic() - self.last_ckpt_time >= cfg.interval_seconds:
            due = True
        if not due or (force and self.c.iterations == self.last_ckpt_iter and self.c.checkpoints > 0):
            return
        self.c.checkpoints += 1
        state = {
            "format": 1,
            "job_name": self.job.metadata.name,
            "algorithm_name": self.spec.algorithm.name.value,
            "algorithm": self.algo.state_dict(),
            "counters": self.c.as_dict(),
            "recent_returns": torch.tensor(list(self.recent_returns), dtype=torch.float64),
            "torch_rng": torch.get_rng_state(),
        }
        path = ckpt.save_checkpoint(self.ckpt_dir, self.c.iterations, state, cfg.keep_last)
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_iter = self.c.iterations
        self.metrics.inc("kuberl_checkpoints_total", 1)
        self.metrics.set("kuberl_checkpoint_timestamp_seconds", time.time())
        self.metrics.set("kuberl_checkpoint_iteration", self.c.iterations)
        self.report.checkpoint(path)

    # ---- evaluation ------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        from kuberl.trainer.evaluation import evaluate

        self.publish_weights()
        results = evaluate(self.spec, self.workers, self.weights_ref, self.weights_version)
        main = results.get("deterministic")
        if main and main.get("mean_return") is not None:
            self.metrics.set("kuberl_evaluation_return_mean", main["mean_return"])
        for name, res in results.items():
            if "win_rate" in res:
                self.metrics.set_win_rate(name, res["win_rate"])
        return results

"""A run in MLflow (`spec.tracking.mlflow`): the resolved job as parameters, every iteration's metrics at its
env steps, and at the end the run's files and the exported policy as artifacts; a sweep is a parent run
with one child run per trial (MLflow's `mlflow.parentRunId` tag).

It speaks MLflow's REST API (`/api/2.0/mlflow/...`, artifacts through the server's proxy,
`/api/2.0/mlflow-artifacts/...`) with the standard library: the images carry no MLflow client, and
nothing here is on the training path. Everything goes through one background thread: training only
appends to a queue, so a tracker that is slow or down slows nothing. While it is down, metrics wait in
the queue (up to `QUEUED_POINTS_MAX`; past that the oldest go, counted and said) and are sent, in order,
once it answers again; `reachable` says which (the learner's `kuberl_tracker_reachable` metric, and from
it the job's status). At the end the run waits at most `flush_seconds` for the queue to drain.

Credentials are MLflow's own environment variables, MLFLOW_TRACKING_TOKEN (a bearer token) or
MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (basic auth): on a cluster the learner pod gets them
from the job's Secret. Every answer is read up to `ANSWER_BYTES_MAX` and within `timeout` seconds.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kuberl.trainer import tensorboard_log
from kuberl.trainer.log_tail import LogTail

log = logging.getLogger("kuberl.trainer")

#: MLflow's own limits per log-batch request (its REST API reference: 1,000 metrics, 100 params).
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
#: MLflow keeps a parameter value of at most 6,000 characters (mlflow/utils/validation.py,
#: MAX_PARAM_VAL_LENGTH); longer values (a big kwargs map) are cut, and say so.
PARAM_VALUE_MAX = 6000
PARAM_KEY_MAX = 250
#: Metric points kept while the tracker is down: a long run at one row a second for more than a day.
QUEUED_POINTS_MAX = 200_000
ANSWER_BYTES_MAX = 1 << 20
#: Waits between tries while the tracker is down, doubling up to the last.
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0, 15.0)
#: Seconds between sends while the tracker answers: the rows of a fast run go in one request, not one each
#: (each is the tracker's CPU and this process's; bench/bench_tracking.py measured one request a row).
SEND_INTERVAL_SECONDS = 2.0
#: Once the run is closing, the wait between its last tries: short, but not a loop of refused connections.
CLOSING_RETRY_SECONDS = 0.5
#: Seconds a run that is stopped by SIGTERM, interrupted or failing gives its tracker for what is queued: a
#: pod being deleted has its grace period to keep, and the next learner goes on in the same run.
EXIT_WAIT_SECONDS = 5.0


class TrackerError(Exception):
    """The tracker could not be reached, or refused a request (`status`: its HTTP status, if it answered)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


#: MLflow's characters for a parameter's or a metric's name (mlflow/utils/validation.py): others become _.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./ ")


def _mlflow_name(key: str) -> str:
    return "".join(c if c in _NAME_CHARS else "_" for c in key)


def _credentials_header() -> dict[str, str]:
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error here: followed, it would carry the credentials' header to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 (urllib's signature)
        return None


_OPENER = urllib.request.build_opener(_NoRedirects())


class MLflowREST:
    """The few calls a run needs, each bounded in time and in the bytes it reads back."""

    def __init__(self, uri: str, timeout: float = 10.0):
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self.headers = _credentials_header()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "Content-Type": "application/json"}
        return json.loads(self._send(urllib.request.Request(url, data=data, method=method, headers=headers)) or b"{}")

    def upload(self, artifact_uri: str, name: str, data: bytes) -> None:
        """PUT a file through the server's artifact proxy (`mlflow server --serve-artifacts`, its default)."""
        prefix = "mlflow-artifacts:/"
        if not artifact_uri.startswith(prefix):
            raise TrackerError(f"the run's artifact location {artifact_uri!r} is not the server's proxy "
                               "(mlflow-artifacts:/): start the server with --serve-artifacts to keep the run's files")
        where = urllib.parse.quote(f"{artifact_uri[len(prefix):].strip('/')}/{name}")
        request = urllib.request.Request(f"{self.uri}/api/2.0/mlflow-artifacts/artifacts/{where}", data=data,
                                         method="PUT", headers={**self.headers,
                                                                "Content-Type": "application/octet-stream"})
        self._send(request)

    def _send(self, request: urllib.request.Request) -> bytes:
        try:
            with _OPENER.open(request, timeout=self.timeout) as answer:
                return answer.read(ANSWER_BYTES_MAX)
        except urllib.error.HTTPError as err:
            detail = err.read(2048).decode(errors="replace")
            raise TrackerError(f"{request.get_method()} {request.full_url}: HTTP {err.code}: {detail}",
                               err.code) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise TrackerError(f"{request.get_method()} {request.full_url}: {err}") from None

    # -- what a run needs --

    def experiment_id(self, name: str) -> str:
        try:
            return self.call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"][
                "experiment_id"]
        except TrackerError as err:
            if "RESOURCE_DOES_NOT_EXIST" not in str(err):
                raise
        try:
            return self.call("POST", "experiments/create", {"name": name})["experiment_id"]
        except TrackerError as err:  # created by another run meanwhile (a sweep's trials start together)
            if "RESOURCE_ALREADY_EXISTS" not in str(err):
                raise
            return self.call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"][
                "experiment_id"]


def _earlier_run(run_file: Path | None, uri: str) -> str | None:
    """The run id a resumed directory logged to, if it was this server's; a file that does not parse is
    no run (the directory is the tenant's)."""
    try:
        data = json.loads(run_file.read_text()[:4096]) if run_file is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("tracking_uri") != uri:
        return None
    run_id = data.get("run_id")
    return run_id if isinstance(run_id, str) and run_id.isalnum() and len(run_id) <= 64 else None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def flat_params(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested mapping as MLflow parameters: dotted keys, JSON values for lists, each cut to MLflow's size."""
    out: dict[str, str] = {}
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            out.update(flat_params(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > PARAM_VALUE_MAX:
        text = text[: PARAM_VALUE_MAX - 14] + "... (cut here)"
    return {_mlflow_name(prefix)[:PARAM_KEY_MAX]: text}


def row_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl row as metrics, named as in TensorBoard (`rollout/mean_return`, `train/loss`): a
    person finds the same curve under the same name in both."""
    return tensorboard_log.row_scalars(row)


def _refused_or_sent(rest: MLflowREST, batch: dict[str, Any]) -> None:
    """One log-batch. One the server refuses as malformed (HTTP 400) is dropped, and said, rather than
    tried again for ever with everything after it waiting; any other failure is the tracker's, for later."""
    try:
        rest.call("POST", "runs/log-batch", batch)
    except TrackerError as err:
        if err.status != 400:
            raise
        log.warning("MLflow refused a batch of %d parameters and %d metric points, dropped: %s",
                    len(batch.get("params", [])), len(batch.get("metrics", [])), err)


class _Outbox:
    """What waits for the tracker, oldest first: parameters, metric points (at most QUEUED_POINTS_MAX;
    past that the oldest go, counted in `dropped`), files, and the run's end once asked for."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.params: dict[str, str] = {}
        self.points: collections.deque = collections.deque(maxlen=QUEUED_POINTS_MAX)
        self.artifacts: list[tuple[str, bytes]] = []
        self.end_status: str | None = None
        self.dropped = 0

    def add_points(self, points: Iterable[dict[str, Any]], *, front: bool = False) -> None:
        with self.lock:
            for point in (reversed(list(points)) if front else points):
                if len(self.points) == self.points.maxlen:
                    self.dropped += 1
                (self.points.appendleft if front else self.points.append)(point)

    def send(self, rest: MLflowREST, run_id: str, artifact_uri: str) -> bool:
        """Send everything queued, in order; True once the run's end is sent. A failure leaves what was not
        sent queued, in order, for the next try."""
        with self.lock:
            params = list(self.params.items())
        for i in range(0, len(params), PARAMS_PER_BATCH):
            chunk = params[i:i + PARAMS_PER_BATCH]
            _refused_or_sent(rest, {"run_id": run_id, "params": [{"key": k, "value": v} for k, v in chunk]})
            with self.lock:
                for key, _ in chunk:
                    self.params.pop(key, None)
        while True:
            with self.lock:
                batch = [self.points.popleft() for _ in range(min(METRICS_PER_BATCH, len(self.points)))]
            if not batch:
                break
            try:
                _refused_or_sent(rest, {"run_id": run_id, "metrics": batch})
            except TrackerError:
                self.add_points(batch, front=True)
                raise
        while True:
            with self.lock:
                if not self.artifacts:
                    break
                name, data = self.artifacts[0]
            rest.upload(artifact_uri, name, data)
            with self.lock:
                self.artifacts.pop(0)
        with self.lock:
            status = self.end_status
        if status is None:
            return False
        rest.call("POST", "runs/update", {"run_id": run_id, "status": status, "end_time": int(time.time() * 1000)})
        return True


#: The artifact the learner's last log lines go to: what happened, after the pods (and their logs) are gone.
LOG_FILE = "learner.log"


class Tracker:
    """One MLflow run, written from a background thread; `close()` waits at most `flush_seconds` for it.
    The run's last log lines go with its end, as `learner.log`."""

    def __init__(self, uri: str, experiment: str, run_name: str, *, parent_run_id: str | None = None,
                 tags: dict[str, str] | None = None, flush_seconds: float = 30.0, timeout: float = 10.0,
                 run_file: Path | None = None, resume: bool = False):
        self.rest = MLflowREST(uri, timeout=timeout)
        self.run_file = run_file
        self._resume_id = _earlier_run(run_file, self.rest.uri) if resume else None
        self.experiment, self.run_name = experiment, run_name
        self.tags = dict(tags or {})
        if parent_run_id:
            self.tags["mlflow.parentRunId"] = parent_run_id
        self.flush_seconds = flush_seconds
        self.run_id: str | None = None
        self.artifact_uri = ""
        self.reachable: bool | None = None  # None until the first answer or failure
        self.last_error = ""
        self.credentials_refused = False  # the tracker answered 401 or 403
        self.outbox = _Outbox()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._done = threading.Event()
        self._given_up = threading.Event()  # close() stopped waiting: the thread ends
        self._ended = threading.Event()  # the thread ended: all sent, or given up
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlflow-tracker", daemon=True)
        self._thread.start()
        self.log_tail = LogTail().attach()

    def run_id_within(self, seconds: float) -> str | None:
        """The run's id once the tracker has made it, waiting at most `seconds` (a sweep's trials name
        their parent run); None if it has not answered by then."""
        self._wake.set()
        self._started.wait(seconds)
        return self.run_id

    # -- what training calls: never blocks on the tracker --

    def log_params(self, params: dict[str, str]) -> None:
        with self.outbox.lock:
            self.outbox.params.update(params)
        self._wake.set()

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        stamp = int(time.time() * 1000)
        self.outbox.add_points({"key": key, "value": value, "timestamp": stamp, "step": int(step)}
                               for key, value in values.items())
        self._wake.set()

    def log_files(self, directory: Path, names: Iterable[str], under: str = "") -> None:
        for name in names:
            path = directory / name
            if path.is_file():
                with self.outbox.lock:
                    self.outbox.artifacts.append((f"{under}{name}", path.read_bytes()))
        self._wake.set()

    def close(self, status: str = "FINISHED", wait: float | None = None) -> bool:
        """End the run with `status` (FINISHED, FAILED, KILLED) once everything queued is sent, waiting at
        most `wait` seconds (default flush_seconds); returns whether all of it got there."""
        self.log_tail.detach()
        with self.outbox.lock:
            self.outbox.artifacts.append((LOG_FILE, self.log_tail.text()))
            self.outbox.end_status = status
        self._closing.set()
        self._wake.set()
        self._ended.wait(self.flush_seconds if wait is None else wait)
        sent = self._done.is_set()
        if not sent:
            self._given_up.set()
            log.warning("MLflow at %s: %d metric points and the run's end not sent in time (%s)",
                        self.rest.uri, len(self.outbox.points), self.last_error or "no answer yet")
        elif self.outbox.dropped:
            log.warning("MLflow at %s was down long enough that the oldest %d metric points were dropped",
                        self.rest.uri, self.outbox.dropped)
        return sent

    # -- the background thread --

    def _run(self) -> None:
        try:
            self._send_until_done()
        finally:
            self._ended.set()

    def _send_until_done(self) -> None:
        failures = 0
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                self._open_run()
                finished = self.outbox.send(self.rest, self.run_id or "", self.artifact_uri)
            except TrackerError as err:
                if self.reachable is not False:
                    log.warning("MLflow at %s %s; metrics wait and are sent when it answers",
                                self.rest.uri, _what_failed(err))
                self.reachable, self.last_error = False, str(err)
                self.credentials_refused = err.status in (401, 403)
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                # Refused credentials do not change by waiting: the try after close() was the last.
                if self._given_up.is_set() or (self._closing.is_set() and self.credentials_refused):
                    return
                if self._closing.is_set():
                    self._given_up.wait(CLOSING_RETRY_SECONDS)
                else:
                    self._closing.wait(delay)  # a close() cuts the backoff short for its last tries; new rows do not
                self._wake.set()
                continue
            if self.reachable is False:
                log.info("MLflow at %s answers again", self.rest.uri)
            self.reachable, self.credentials_refused, failures = True, False, 0
            if finished:
                self._done.set()
                return
            self._closing.wait(SEND_INTERVAL_SECONDS)  # what comes meanwhile goes in the next request

    def _open_run(self) -> None:
        """The run to log to: the one a resumed directory logged to, or a new one (its id kept in run_file)."""
        if self.run_id is None and self._resume_id is not None:
            try:
                run = self.rest.call("GET", "runs/get", query={"run_id": self._resume_id})
            except TrackerError as err:
                if "RESOURCE_DOES_NOT_EXIST" not in str(err):
                    raise
                self._resume_id = None  # deleted in MLflow meanwhile: a new run
            else:
                self.rest.call("POST", "runs/update", {"run_id": self._resume_id, "status": "RUNNING"})
                self.run_id, self.artifact_uri = self._resume_id, run["run"]["info"]["artifact_uri"]
        if self.run_id is None:
            experiment_id = self.rest.experiment_id(self.experiment)
            tags = [{"key": k, "value": v} for k, v in self.tags.items()]
            run = self.rest.call("POST", "runs/create", {"experiment_id": experiment_id, "run_name": self.run_name,
                                                         "start_time": int(time.time() * 1000), "tags": tags})
            self.run_id, self.artifact_uri = run["run"]["info"]["run_id"], run["run"]["info"]["artifact_uri"]
            if self.run_file is not None:
                _write_atomically(self.run_file, json.dumps({"tracking_uri": self.rest.uri, "run_id": self.run_id}))
        self._started.set()


def _what_failed(err: TrackerError) -> str:
    """A tracker's failure as a user acts on it: credentials refused say where credentials come from."""
    if err.status in (401, 403):
        return (f"refused the credentials ({err}): give the run MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN (on a cluster: the keys username and password, "
                "or token, of spec.tracking.mlflow.credentialsSecret)")
    return f"is unreachable ({err})"


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The final evaluation's numbers, named as in TensorBoard (`eval/deterministic/mean_return`)."""
    return tensorboard_log.evaluation_scalars(summary.get("evaluation") or {})


#: In the run directory: the run this directory's training logs to, so that a resumed run (a restarted
#: learner pod, `kuberl train --resume`) goes on in the same MLflow run.
RUN_FILE = "mlflow_run.json"


def tracker_for(job, run_dir: Path, *, resume: bool, parent_run_id: str | None = None) -> Tracker | None:
    """The job's tracker when it asks for one (spec.tracking.mlflow), else None; on resume, the run the
    directory logged to before, when it is the same server's."""
    spec = job.spec.tracking.mlflow
    if spec is None:
        return None
    return Tracker(spec.tracking_uri, spec.experiment or job.metadata.name, spec.run_name or job.metadata.name,
                   parent_run_id=parent_run_id,
                   tags={"kuberl.job": job.metadata.name, "kuberl.namespace": job.metadata.namespace,
                         "kuberl.algorithm": job.spec.algorithm.name.value,
                         "kuberl.environment": job.spec.environment.id},
                   run_file=run_dir / RUN_FILE, resume=resume)


def sweep_tracker(sweep, directory: Path, *, resume: bool) -> Tracker | None:
    """A sweep's parent run, when its template asks for a tracker: its trials are the children."""
    spec = sweep.spec.template.tracking.mlflow
    if spec is None:
        return None
    return Tracker(spec.tracking_uri, spec.experiment or sweep.metadata.name, sweep.metadata.name,
                   tags={"kuberl.sweep": sweep.metadata.name, "kuberl.namespace": sweep.metadata.namespace},
                   run_file=directory / RUN_FILE, resume=resume)

"""A learner's /metrics is the tenant's to answer: the operator reads at most MAX_METRICS_BYTES within
scrape_timeout, follows no redirect, parses off its event loop, and keeps NaN and infinities out of the
job's status. The learners here are real HTTP servers on 127.0.0.1 read by the real Runtime and
ProgressReader."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import REPO
from kuberl.api.load import parse_job
from kuberl.operator import lifecycle
from kuberl.operator import status as job_status
from kuberl.operator.builders import BuildOptions
from kuberl.operator.jobs import ProgressReader
from kuberl.operator.lifecycle import JobMeta, PodView
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.names import Component
from kuberl.operator.runtime import MAX_METRICS_BYTES, OperatorConfig, Runtime
from kuberl.trainer.metrics import JobLabels, LearnerMetrics
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

JOB = "cartpole-ppo"
GIB = 1024**3
#: What the operator's process may grow by while it reads a hostile learner: far below the
#: operator's 256 Mi limit, and far above the read cap plus aiohttp's buffers.
RSS_GROWTH_LIMIT = 64 * 1024**2

# ---- a learner's metrics port, answering each path as a test tells it --------------------------------

Route = Callable[[BaseHTTPRequestHandler, "Learner"], None]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        learner = self.server.learner
        learner.hits[self.path] += 1
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the operator hung up: wanted here
            learner.routes[self.path](self, learner)

    def log_message(self, *_args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    learner: Learner


class Learner:
    """An HTTP server on 127.0.0.1 in a thread. `hits` counts requests by path; `sent` the body bytes a
    streaming route got into the socket."""

    def __init__(self, routes: dict[str, Route] | None = None):
        self.routes: dict[str, Route] = dict(routes or {})
        self.hits: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.stopped = threading.Event()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.learner = self
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


def answer(body: bytes, content_type: str = CONTENT_TYPE_LATEST, headers: dict[str, str] | None = None) -> Route:
    def route(handler: BaseHTTPRequestHandler, _learner: Learner) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)
    return route


def redirect(status: int, location: str) -> Route:
    def route(handler: BaseHTTPRequestHandler, _learner: Learner) -> None:
        handler.send_response(status)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return route


def stream(total: int, chunk: bytes, declare_length: bool) -> Route:
    """`total` bytes of `chunk` over and over, made as they are sent (never all in memory)."""
    def route(handler: BaseHTTPRequestHandler, learner: Learner) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", CONTENT_TYPE_LATEST)
        if declare_length:
            handler.send_header("Content-Length", str(total))
        handler.end_headers()
        left = total
        while left > 0 and not learner.stopped.is_set():
            piece = chunk[:left]
            handler.wfile.write(piece)
            learner.sent[handler.path] += len(piece)
            left -= len(piece)
    return route


def drip(handler: BaseHTTPRequestHandler, learner: Learner) -> None:
    """Headers, then one byte of a valid sample every 50 ms, for as long as anyone listens."""
    handler.send_response(200)
    handler.send_header("Content-Type", CONTENT_TYPE_LATEST)
    handler.end_headers()
    line = f'kuberl_episodes_total{{job_name="{JOB}"}} 1\n'.encode()
    for i in range(10**6):
        if learner.stopped.wait(0.05):  # pacing the drip; nothing waits on it
            return
        handler.wfile.write(line[i % len(line):][:1])


def silent(handler: BaseHTTPRequestHandler, learner: Learner) -> None:
    """Accept the request and never answer."""
    learner.stopped.wait(600)


# ---- what a learner serves -----------------------------------------------------------------------------


def real_learner_metrics() -> LearnerMetrics:
    learner = LearnerMetrics(JobLabels(JOB, "default", "PPO", "CartPole-v1"))
    learner.inc("kuberl_episodes_total", 321)
    learner.inc("kuberl_env_steps_total", 45_000)
    learner.set("kuberl_episodes_per_second", 12.5)
    learner.set("kuberl_env_steps_per_second", 1800.0)
    learner.set("kuberl_episode_return_mean", 199.5)
    learner.set("kuberl_training_wall_clock_seconds", 25.0)
    learner.inc("kuberl_gradient_updates_total", 96)
    learner.inc("kuberl_iterations_total", 6)
    learner.set("kuberl_checkpoint_timestamp_seconds", 1_700_000_000)
    learner.set("kuberl_checkpoint_iteration", 6)
    learner.set_policy_return("adversary", -14.234)
    learner.set_policy_return("good", 6.3333)
    return learner


def finished_learner_text() -> str:
    """A finished learner's metrics: every field of the report has a value."""
    learner = real_learner_metrics()
    learner.set("kuberl_evaluation_return_mean", 200.0)
    learner.set_win_rate("vs-random-first", 0.99)
    learner.set("kuberl_job_finished", 1)
    return generate_latest(learner.registry).decode()


def filler_lines(size: int) -> bytes:
    """Valid samples the operator does not read, `size` bytes of whole lines."""
    line = f'kuberl_learner_loss{{job_name="{JOB}",namespace="default",rank="0000000"}} 0.5\n'.encode()
    return line * (size // len(line))


# ---- the operator's side -------------------------------------------------------------------------------


@pytest.fixture
def learner() -> Iterator[Learner]:
    server = Learner()
    yield server
    server.close()


@pytest.fixture
def job(job_dict):
    return parse_job(job_dict)


class Scrape:
    """One ProgressReader.read of a learner: its report, the errors it counted by kind, its seconds."""

    def __init__(self, report: job_status.LearnerReport | None, metrics: OperatorMetrics, seconds: float):
        self.report, self.seconds = report, seconds
        samples = metrics.errors.collect()[0].samples
        self.errors = {s.labels["kind"]: s.value for s in samples if s.name.endswith("_total") and s.value}
        assert all(s.labels["handler"] == "progress" for s in samples)


def learner_pod() -> PodView:
    return PodView(f"{JOB}-learner", Component.LEARNER, phase="Running", ip="127.0.0.1")


async def scrape(job, url: str, scrape_timeout: float = 30.0) -> Scrape:
    metrics = OperatorMetrics()
    runtime = Runtime(OperatorConfig(learner_metrics_url=url, scrape_timeout=scrape_timeout), metrics=metrics)
    try:
        started = time.perf_counter()
        report = await ProgressReader(runtime, JOB, logging.getLogger(__name__)).read(job, [learner_pod()])
        return Scrape(report, metrics, time.perf_counter() - started)
    finally:
        await runtime.close()


def applied(job, report: job_status.LearnerReport | None, status=None):
    """The job's status after one reconcile pass with this report (None: a scrape that failed)."""
    status = status or job_status.load({"phase": "Running"})
    return lifecycle.plan(meta=JobMeta(JOB, "default", "uid-1", 1), job=job, problems=[], status=status,
                          pods=[learner_pod()], now=job_status.now(), options=BuildOptions(),
                          report=report).status


def progress_of(status) -> dict:
    raw = job_status.dump(status)
    return {key: raw[key] for key in ("progress", "lastCheckpoint", "lastCheckpointTime", "evaluation")}


# ---- size ----------------------------------------------------------------------------------------------

_READ_A_GIB = r"""
import asyncio, json, logging, resource, sys, time
import yaml
from kuberl.api.load import parse_job
from kuberl.operator.jobs import ProgressReader
from kuberl.operator.lifecycle import PodView
from kuberl.operator.metrics import OperatorMetrics
from kuberl.operator.names import Component
from kuberl.operator.runtime import OperatorConfig, Runtime

def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

async def main(normal, huge):
    job = parse_job(yaml.safe_load(open("examples/cartpole-ppo.yaml")))
    pods = [PodView(job.metadata.name + "-learner", Component.LEARNER, phase="Running", ip="127.0.0.1")]
    metrics = OperatorMetrics()
    runtime = Runtime(OperatorConfig(learner_metrics_url=normal, scrape_timeout=120.0), metrics=metrics)
    reader = ProgressReader(runtime, job.metadata.name, logging.getLogger("read"))
    warm = await reader.read(job, pods)  # imports, the HTTP session and the parse thread are in place
    before = peak_rss()
    runtime.config.learner_metrics_url = huge
    reader.last_read = float("-inf")
    started = time.perf_counter()
    report = await reader.read(job, pods)
    seconds = time.perf_counter() - started
    errors = {s.labels["kind"]: s.value for s in metrics.errors.collect()[0].samples
              if s.name.endswith("_total") and s.value}
    await runtime.close()
    print(json.dumps({"warm": warm is not None, "report": report is not None, "errors": errors,
                      "seconds": seconds, "growth": peak_rss() - before}))

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("declare_length", [False, True], ids=["streamed", "content-length"])
def test_a_learner_streaming_a_gib_is_cut_off_at_the_cap_and_the_operator_stays_small(learner, declare_length):
    """The operator's process (a subprocess, so its peak RSS is its own) reads a learner that sends 1 GiB
    of valid metrics: it stops at the cap with MetricsTooLarge, long before its scrape_timeout, and its
    peak RSS grows by a few MiB; the learner got only as far as the socket buffers."""
    learner.routes["/metrics"] = answer(generate_latest(real_learner_metrics().registry))
    learner.routes["/huge"] = stream(GIB, filler_lines(64 * 1024), declare_length)
    proc = subprocess.run([sys.executable, "-c", _READ_A_GIB, learner.url("/metrics"), learner.url("/huge")],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["warm"] and not result["report"]
    assert result["errors"] == {"MetricsTooLarge": 1.0}
    assert result["seconds"] < 30, "the cap, not the 120 s timeout, must end the read"
    assert result["growth"] < RSS_GROWTH_LIMIT, f"peak RSS grew by {result['growth'] / 2**20:.0f} MiB"
    assert learner.sent["/huge"] < 64 * 1024**2


async def test_a_failed_read_leaves_the_status_as_it_was(job, learner):
    learner.routes["/metrics"] = answer(finished_learner_text().encode())
    learner.routes["/huge"] = stream(GIB, filler_lines(64 * 1024), declare_length=False)
    before = applied(job, (await scrape(job, learner.url("/metrics"))).report)
    assert before.progress.episodes == 321
    failed = await scrape(job, learner.url("/huge"))
    assert failed.report is None and failed.errors == {"MetricsTooLarge": 1.0}
    assert progress_of(applied(job, failed.report, before)) == progress_of(before)


async def test_a_body_of_exactly_the_cap_is_read(job, learner):
    head = finished_learner_text().encode()
    body = head + filler_lines(MAX_METRICS_BYTES - len(head))
    body += b"\n" * (MAX_METRICS_BYTES - len(body))
    assert len(body) == MAX_METRICS_BYTES
    learner.routes["/metrics"] = stream(len(body), body, declare_length=False)
    result = await scrape(job, learner.url("/metrics"))
    assert result.errors == {}
    assert result.report is not None and result.report.progress.episodes == 321
    learner.routes["/over"] = stream(len(body) + 1, body + b"\n", declare_length=False)
    over = await scrape(job, learner.url("/over"))
    assert over.report is None and over.errors == {"MetricsTooLarge": 1.0}


# ---- redirects, time, encodings ------------------------------------------------------------------------


async def test_a_redirect_loop_is_one_request_and_an_error(job, learner):
    learner.routes["/loop"] = redirect(302, "/loop")
    result = await scrape(job, learner.url("/loop"))
    assert result.report is None and result.errors == {"MetricsRedirected": 1.0}
    assert learner.hits["/loop"] == 1


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_elsewhere_is_never_followed(job, learner, status):
    elsewhere = Learner({"/metrics": answer(finished_learner_text().encode())})
    try:
        learner.routes["/metrics"] = redirect(status, elsewhere.url("/metrics"))
        result = await scrape(job, learner.url("/metrics"))
        assert result.report is None and result.errors == {"MetricsRedirected": 1.0}
        assert learner.hits["/metrics"] == 1
        assert elsewhere.hits == Counter(), "the operator fetched the URL the learner chose"
    finally:
        elsewhere.close()


@pytest.mark.parametrize("route", [drip, silent], ids=["one-byte-every-50ms", "never-answers"])
async def test_a_slow_learner_is_given_up_on_at_the_scrape_timeout(job, learner, route):
    learner.routes["/metrics"] = route
    result = await scrape(job, learner.url("/metrics"), scrape_timeout=1.0)
    assert result.report is None and result.errors == {"TimeoutError": 1.0}
    assert result.seconds < 1.0 + 10, "a loaded machine may be late, but not by the whole drip"


async def test_a_compressed_or_undecodable_body_is_refused(job, learner):
    text = finished_learner_text().encode()
    learner.routes["/gzip"] = answer(gzip.compress(text), headers={"Content-Encoding": "gzip"})
    learner.routes["/latin1"] = answer(text.replace(b"cartpole-ppo", "cartp\xf6le-ppo".encode("latin-1")))
    gzipped = await scrape(job, learner.url("/gzip"))
    assert gzipped.report is None and gzipped.errors == {"MetricsRefused": 1.0}
    latin1 = await scrape(job, learner.url("/latin1"))
    assert latin1.report is None and latin1.errors == {"UnicodeDecodeError": 1.0}


async def test_a_real_learner_still_reads_exactly_as_before(job):
    """prometheus_client's own server (as the learner runs it), which compresses when asked: the operator
    asks for identity and gets the same report as a parse of the text."""
    metrics = real_learner_metrics()
    port = metrics.serve(0, addr="127.0.0.1")
    try:
        result = await scrape(job, f"http://127.0.0.1:{port}/metrics")
    finally:
        metrics.close()
    assert result.errors == {}
    expected = job_status.parse_learner_metrics(generate_latest(metrics.registry).decode(), job_name=JOB)
    report = result.report
    assert report is not None
    assert report.progress == expected.progress
    p = report.progress
    assert (p.episodes, p.env_steps, p.gradient_updates, p.iterations) == (321, 45_000, 96, 6)
    assert (p.episodes_per_second, p.env_steps_per_second, p.wall_clock_seconds) == (12.5, 1800.0, 25.0)
    assert p.mean_return == 199.5
    assert p.returns_by_policy == {"adversary": -14.2, "good": 6.33}
    assert report.last_checkpoint_time.timestamp() == 1_700_000_000
    assert report.last_checkpoint == "ckpt-000000006.pt"
    assert (report.finished, report.evaluation) == (False, None)


# ---- the event loop -------------------------------------------------------------------------------------


#: The longest the event loop may go without running a ready task while a body is parsed. A parse on the
#: loop would stall it for the whole parse: over a second for the body below. A thread holding the GIL
#: lets the loop in every 5 ms; the rest of the bound is for a loaded machine's scheduler.
LOOP_STALL_LIMIT = 0.25


async def test_parsing_a_body_near_the_cap_leaves_the_event_loop_free(job, learner):
    head = finished_learner_text().encode()
    dear = b'x{a="b"} 1\n'  # the most samples per byte: the dearest body to parse
    body = head + dear * ((MAX_METRICS_BYTES - 1024 - len(head)) // len(dear))
    learner.routes["/metrics"] = answer(body)
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker's first tick
    try:
        result = await scrape(job, learner.url("/metrics"))
        ended = time.perf_counter()
    finally:
        ticking.cancel()
    assert result.errors == {} and result.report is not None and result.report.progress.episodes == 321
    stall = max(b - a for a, b in zip(ticks, [*ticks[1:], ended]))
    started = time.perf_counter()
    job_status.parse_learner_metrics(body.decode(), job_name=JOB)
    parse_seconds = time.perf_counter() - started
    # A parse on the loop would stall it for the whole parse; off the loop, only for the GIL's turns. On a
    # machine busy enough to slow the parse, those turns slow too: the limit grows with the parse's own time
    # (a quarter of it, still far below a blocked loop's whole parse), never below LOOP_STALL_LIMIT.
    limit = max(LOOP_STALL_LIMIT, parse_seconds / 4)
    assert stall < limit, (f"the event loop stalled {stall:.3f} s while a {len(body)}-byte body was "
                           f"read and parsed (the parse alone takes {parse_seconds:.3f} s)")


# ---- NaN, infinities, numbers the status cannot hold ----------------------------------------------------

#: Every sample the report reads, by the name in the text.
READ_SAMPLES = (*job_status.PROGRESS_METRICS, job_status.CHECKPOINT_METRIC, "kuberl_checkpoint_iteration",
                "kuberl_job_finished", "kuberl_evaluation_return_mean", "kuberl_evaluation_win_rate",
                job_status.POLICY_RETURN_METRIC)


def with_value(text: str, name: str, value: str | None) -> str:
    """The text with every sample of `name` set to `value` (None: the samples removed)."""
    pattern = re.compile(rf"^{name}\{{[^\n]*\}} \S+\n", re.MULTILINE)
    assert pattern.search(text), name
    return pattern.sub(lambda m: "" if value is None else m.group(0).rsplit(" ", 1)[0] + f" {value}\n", text)


def report_fields(report: job_status.LearnerReport) -> tuple:
    return (report.progress.model_dump(), report.last_checkpoint_time, report.finished, report.last_checkpoint,
            report.evaluation)


def assert_storable(job, report: job_status.LearnerReport) -> None:
    """The status built from the report is JSON the API server accepts: no NaN, no infinity, int64s."""
    raw = job_status.dump(applied(job, report))
    json.dumps(raw, allow_nan=False)
    progress = raw["progress"]
    assert all(0 <= progress[k] < 2**63 for k in ("episodes", "envSteps", "gradientUpdates", "iterations"))


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN", "1e999", "1" + "0" * 400],
                         ids=["+Inf", "-Inf", "NaN", "1e999", "400-digits"])
def test_a_value_no_float_holds_reads_as_if_the_sample_were_absent(job, value):
    """Each sample the report reads, in turn, set to a value that is not a finite float (the text parser
    makes 400 digits an int past float's range): the report is what it is without that sample."""
    text = finished_learner_text()
    for name in READ_SAMPLES:
        report = job_status.parse_learner_metrics(with_value(text, name, value), job_name=JOB)
        absent = job_status.parse_learner_metrics(with_value(text, name, None), job_name=JOB)
        assert report_fields(report) == report_fields(absent), name
        assert_storable(job, report)


@pytest.mark.parametrize("value", ["1e300", "9.3e18", "-5"])
def test_a_finite_value_past_what_the_status_holds_never_reaches_it(job, value):
    text = finished_learner_text()
    for name in READ_SAMPLES:
        report = job_status.parse_learner_metrics(with_value(text, name, value), job_name=JOB)
        assert_storable(job, report)
    huge_time = job_status.parse_learner_metrics(with_value(text, job_status.CHECKPOINT_METRIC, value), job_name=JOB)
    assert huge_time.last_checkpoint_time is None and huge_time.last_checkpoint is None


def test_metrics_with_only_non_finite_progress_are_refused_as_no_progress():
    text = "".join(f"{name} NaN\n" for name in job_status.PROGRESS_METRICS)
    with pytest.raises(ValueError, match="no kuberl_"):
        job_status.parse_learner_metrics(text)


def test_a_sample_timestamp_past_floats_range_is_a_parse_error():
    with pytest.raises(ValueError, match="not Prometheus text format"):
        job_status.parse_learner_metrics("kuberl_episodes_total 1 1" + "0" * 400 + "\n")


def test_a_line_longer_than_any_learner_writes_is_refused():
    line = 'kuberl_episodes_total{job_name="' + '\\"' * job_status.MAX_METRICS_LINE_CHARS + '"} 1\n'
    with pytest.raises(ValueError, match=f"the most read is {job_status.MAX_METRICS_LINE_CHARS}"):
        job_status.parse_learner_metrics(line)


async def test_infinities_from_a_learner_reach_no_status(job, learner):
    """Over HTTP: every sample infinite or NaN but the episodes; the scrape counts no error, the status
    holds the episodes and no number JSON cannot carry."""
    text = finished_learner_text()
    for i, name in enumerate(n for n in READ_SAMPLES if n != "kuberl_episodes_total"):
        text = with_value(text, name, ("+Inf", "-Inf", "NaN")[i % 3])
    learner.routes["/metrics"] = answer(text.encode())
    result = await scrape(job, learner.url("/metrics"))
    assert result.errors == {}
    assert result.report is not None and result.report.progress.episodes == 321
    assert result.report.progress.mean_return is None and result.report.last_checkpoint_time is None
    assert_storable(job, result.report)


def test_a_learner_cannot_grow_the_status_with_evaluation_suites():
    """A finished learner names its evaluation suites; no more than a spec can hold reach the status."""
    from kuberl.operator.status import MAX_SUITES, parse_learner_metrics

    lines = ["kuberl_job_finished 1", "kuberl_episodes_total 10", "kuberl_evaluation_return_mean 5"]
    lines += [f'kuberl_evaluation_win_rate{{suite="s{i}"}} 0.5' for i in range(1000)]
    lines += [f'kuberl_evaluation_win_rate{{suite="{"x" * 200}"}} 0.5']
    report = parse_learner_metrics("\n".join(lines) + "\n")
    suites = [name for name in report.evaluation if name != "deterministic"]
    assert len(suites) == MAX_SUITES == 32 and all(len(name) <= 63 for name in suites)


def test_a_learner_cannot_grow_the_status_with_policy_returns(job):
    """Returns by policy group: only names a spec's groups can have, no more groups than a spec can give, the
    first value of each; a name that could not be a group's (a quote, capitals, past 31 characters) never
    reaches the status."""
    from kuberl.api.job import MAX_POLICY_GROUPS

    lines = ["kuberl_episodes_total 10", 'kuberl_policy_episode_return_mean{policy="Bad"} 1',
             f'kuberl_policy_episode_return_mean{{policy="{"x" * 32}"}} 1',
             'kuberl_policy_episode_return_mean{policy="a\\"b"} 1', 'kuberl_policy_episode_return_mean 1']
    lines += [f'kuberl_policy_episode_return_mean{{policy="p{i}"}} 10{i}.26' for i in range(1000)]
    lines += ['kuberl_policy_episode_return_mean{policy="p0"} 99']
    report = job_status.parse_learner_metrics("\n".join(lines) + "\n")
    expected = {f"p{i}": 100.3 + i for i in range(MAX_POLICY_GROUPS)}  # to 0.1, as kubectl get shows it
    assert report.progress.returns_by_policy == pytest.approx(expected, abs=1e-9)
    assert_storable(job, report)
    assert job_status.dump(applied(job, report))["progress"]["returnsByPolicy"] == report.progress.returns_by_policy

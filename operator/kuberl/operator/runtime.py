"""What every handler shares: the operator's settings, the Kubernetes clients, metrics and wake-ups.

One `Runtime` lives in kopf's memo (`memo.runtime`). API calls go through the `kubernetes`
package's synchronous client on a small thread pool, so the event loop never blocks on I/O.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kubernetes

from kuberl.api.job import GROUP, PLURAL, VERSION, RLTrainingJob
from kuberl.api.tenancy import Tenancy
from kuberl.operator import builders
from kuberl.operator.builders import BuildOptions
from kuberl.operator.metrics import OPERATOR_METRICS, OperatorMetrics
from kuberl.operator.pods import PodView

#: Where the operator reads a learner's progress. Placeholders: {pod_ip}, {port}, {job}, {namespace},
#: {metrics_service}. The default reads the pod directly (no DNS, works before Services resolve).
DEFAULT_LEARNER_METRICS_URL = "http://{pod_ip}:{port}/metrics"

#: Resolves a learner's metrics URL; None means "cannot scrape now" (e.g. the pod has no IP yet).
MetricsUrlResolver = Callable[[RLTrainingJob, PodView], "str | None"]

#: The most the operator reads of a learner's /metrics; the pod is the tenant's, so its answer may be
#: anything. A real learner serves 8.5 KB (CartPole PPO) and 37 KB at most (kuberl.trainer.metrics with
#: the longest names the spec allows and 33 evaluation suites): the cap is 28 times that, far below the
#: operator's 256 Mi memory limit, and it bounds the time the parse takes.
MAX_METRICS_BYTES = 1024 * 1024


class MetricsRefused(ValueError):
    """A learner's /metrics answer the operator does not read (compressed, too large, a redirect)."""


class MetricsTooLarge(MetricsRefused):
    """The learner's /metrics is larger than MAX_METRICS_BYTES; the read stopped at the cap."""


class MetricsRedirected(MetricsRefused):
    """The learner's /metrics answered a redirect: the operator fetches no URL the learner chooses."""


def url_from_template(template: str) -> MetricsUrlResolver:
    def resolve(job: RLTrainingJob, pod: PodView) -> str | None:
        if "{pod_ip}" in template and not pod.ip:
            return None
        return template.format(pod_ip=pod.ip or "", port=builders.metrics_port(job), job=job.metadata.name,
                               namespace=job.metadata.namespace,
                               metrics_service=f"{job.metadata.name}-metrics")
    return resolve


@dataclass
class OperatorConfig:
    """The operator's settings (the command line fills them; tests shorten the intervals)."""

    build: BuildOptions = field(default_factory=BuildOptions)
    #: Seconds between passes over an active job when nothing pokes it (pod and job events do).
    reconcile_interval: float = 10.0
    #: Seconds between passes over a finished or suspended job (only TTLs and edits matter then).
    idle_interval: float = 300.0
    #: Seconds between reads of a running learner's /metrics into status.progress.
    progress_interval: float = 10.0
    #: Seconds one read of a learner's /metrics may take, from connecting to its last byte.
    scrape_timeout: float = 3.0
    learner_metrics_url: MetricsUrlResolver | str = DEFAULT_LEARNER_METRICS_URL
    #: Threads for Kubernetes API calls (pods of many jobs are created concurrently).
    api_threads: int = 4
    #: What each namespace's job pods may be, and the operator's own namespace (where no job may run).
    tenancy: Tenancy = field(default_factory=Tenancy)

    def metrics_url(self) -> MetricsUrlResolver:
        if isinstance(self.learner_metrics_url, str):
            return url_from_template(self.learner_metrics_url)
        return self.learner_metrics_url


class ApiError(Exception):
    """A Kubernetes API call failed; `.status` is the HTTP status, `.message` the server's words."""

    def __init__(self, status: int, reason: str, message: str):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"HTTP {status} {reason}: {message}")


def _api_error(err: kubernetes.client.ApiException) -> ApiError:
    message = str(err.reason or "")
    try:
        message = json.loads(err.body).get("message", message)
    except (TypeError, ValueError, AttributeError):
        pass
    return ApiError(err.status or 0, str(err.reason or ""), message)


class Kube:
    """The handful of API calls the operator makes, returning plain dicts (camelCase, as served)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, threads: int):
        self.api_client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.networking = kubernetes.client.NetworkingV1Api(api_client)
        self.policy = kubernetes.client.PolicyV1Api(api_client)
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kuberl-api")

    async def _call(self, fn: Callable[..., Any], *args: Any, parse: bool = True, **kwargs: Any) -> Any:
        """Run one API call on the thread pool; the response as a dict (parse=False: nothing, saves memory)."""
        def call() -> Any:
            try:
                response = fn(*args, _preload_content=False, **kwargs)
            except kubernetes.client.ApiException as err:
                raise _api_error(err) from None
            data = response.data
            return json.loads(data) if parse and data else None

        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        data = await self._call(self.core.list_namespaced_pod, namespace, label_selector=label_selector)
        return list(data.get("items") or [])

    async def create(self, manifest: dict[str, Any], *, dry_run: bool = False) -> None:
        """Create an object; with `dry_run`, only ask whether the server would (validation, admission,
        quota), writing nothing."""
        namespace = manifest["metadata"]["namespace"]
        kind = manifest["kind"]
        fn = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "Secret": self.core.create_namespaced_secret,
            "ConfigMap": self.core.create_namespaced_config_map,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
            "Deployment": self.apps.create_namespaced_deployment,
        }[kind]
        await self._call(fn, namespace, manifest, parse=False, **({"dry_run": "All"} if dry_run else {}))

    async def patch_disruption_budget(self, namespace: str, name: str, min_available: int) -> None:
        await self._call(self.policy.patch_namespaced_pod_disruption_budget, name, namespace,
                         {"spec": {"minAvailable": min_available}}, parse=False)

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self._call(self.core.delete_namespaced_pod, name, namespace, body=body, parse=False)

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self.patch_status(PLURAL, namespace, name, status)

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """The status subresource of one of our kinds (`plural`), as a merge patch."""
        await self._call(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
                         plural, name, {"status": status}, parse=False)  # the client sends merge-patch

    async def list_jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        data = await self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                                label_selector=label_selector)
        return list(data.get("items") or [])

    async def create_job(self, manifest: dict[str, Any]) -> None:
        await self._call(self.custom.create_namespaced_custom_object, GROUP, VERSION,
                         manifest["metadata"]["namespace"], PLURAL, manifest, parse=False)

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                         patch, parse=False)

    async def delete_job(self, namespace: str, name: str, uid: str | None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self._call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                         body=body, parse=False)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.api_client.close()


def default_api_client() -> kubernetes.client.ApiClient:
    """In a pod: its service account; elsewhere: the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    try:
        kubernetes.config.load_incluster_config()
        configuration = kubernetes.client.Configuration.get_default_copy()
    except kubernetes.config.ConfigException:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = 32
    return kubernetes.client.ApiClient(configuration)


#: An object's key among the operator's loops: its kind's plural, its namespace, its name (a job and a sweep
#: of one name are two keys).
Key = tuple[str, str, str]


class Runtime:
    """The state shared by the loops: config, API, metrics, and one wake-up event per object."""

    def __init__(self, config: OperatorConfig, api_client: kubernetes.client.ApiClient | None = None,
                 metrics: OperatorMetrics | None = None):
        self.config = config
        self._api_client = api_client
        self._kube: Kube | None = None
        self.metrics = metrics or OPERATOR_METRICS
        self.pokes: dict[Key, asyncio.Event] = {}
        #: The spec each object's loop last acted on (its events poke only when it changed).
        self.seen_specs: dict[Key, str] = {}
        #: Each object's last few status writes as the API stores them (nulls dropped): an event whose status
        #: is none of them is another writer's, which the object's loop overwrites with what it knows.
        self.written_statuses: dict[Key, collections.deque[dict[str, Any]]] = {}
        self.http: aiohttp.ClientSession | None = None
        #: Background tasks of the operator (the event-loop watch), cancelled on close.
        self.tasks: set[asyncio.Future] = set()

    @property
    def kube(self) -> Kube:
        # Created on first use, so a Runtime can be built before a kubeconfig is in place.
        if self._kube is None:
            self._kube = Kube(self._api_client or default_api_client(), self.config.api_threads)
        return self._kube

    def poke(self, key: Key) -> None:
        event = self.pokes.get(key)
        if event is not None:
            event.set()

    def overwritten(self, key: Key, status: Any) -> bool:
        """Whether an object's status, as an event shows it, is none of its loop's recent writes."""
        recent = self.written_statuses.get(key)
        return recent is not None and bool(recent) and status not in recent

    async def run_passes(self, key: Key, stopped: Any, one_pass: Callable[[], Awaitable[float]],
                         *, quick_passes: int = 0) -> None:
        """An object's loop (a kopf daemon's): `one_pass` returns seconds until the next pass is due; a poke
        under `key` (an event of the object or of its children) or the daemon's stop wakes it sooner. Up to
        `quick_passes` passes in a row that ask for no wait run at once; then even those wait a little."""
        poke = asyncio.Event()
        self.pokes[key] = poke

        async def wake_on_stop() -> None:
            await stopped.wait()
            poke.set()

        stopper = asyncio.ensure_future(wake_on_stop())
        quick = 0
        try:
            while not stopped:
                poke.clear()
                wait = await one_pass()
                if stopped:
                    break
                if wait <= 0 and quick < quick_passes:
                    quick += 1
                    continue
                quick = 0
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(poke.wait(), timeout=max(wait, 0.05))
        finally:
            stopper.cancel()
            if self.pokes.get(key) is poke:
                del self.pokes[key]

    async def get_metrics(self, url: str) -> bytes:
        """A learner's /metrics body, as sent: at most MAX_METRICS_BYTES, within scrape_timeout.

        Raises MetricsTooLarge past the cap (having buffered no more than the cap), MetricsRedirected on a
        3xx (no redirect is followed), MetricsRefused on a compressed body, aiohttp.ClientResponseError on
        4xx/5xx, and aiohttp.ClientError, OSError or asyncio.TimeoutError when the learner is unreachable
        or slow.
        """
        if self.http is None:
            # Uncompressed only: a compressed body's size says nothing of what it inflates to. No cookies:
            # one learner must not set what the operator sends to another.
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.scrape_timeout),
                                              auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                              headers={"Accept-Encoding": "identity"})
        async with self.http.get(url, allow_redirects=False) as response:
            if 300 <= response.status < 400:
                raise MetricsRedirected(
                    f"{url} answered HTTP {response.status}, a redirect to {response.headers.get('Location')!r}; "
                    "the operator follows no redirect from a learner: serve /metrics at the URL itself")
            response.raise_for_status()
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding != "identity":
                raise MetricsRefused(f"{url} sent its metrics with Content-Encoding {encoding!r} although the "
                                     "operator asked for identity; serve them uncompressed")
            too_large = MetricsTooLarge(
                f"{url} sent more than {MAX_METRICS_BYTES} bytes, the most the operator reads of a learner's "
                "/metrics (a learner serves tens of KB): check what the metrics port serves")
            if response.content_length is not None and response.content_length > MAX_METRICS_BYTES:
                raise too_large
            body = bytearray()
            while chunk := await response.content.read(MAX_METRICS_BYTES + 1 - len(body)):
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    raise too_large
            return bytes(body)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self._kube is not None:
            self._kube.close()
            self._kube = None

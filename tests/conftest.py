"""Shared pytest setup: where the repo is, a fresh job dict to edit per test, and the layers.

Tests live in three folders, one per layer, and carry its marker (`-m unit`, `-m "not e2e"`):
- unit/: pure code with the venv only, no system packages, no network; `./scripts/test-unit` runs them;
- integration/: real parts on this machine: kopf against an API server, Ray, training runs, helm,
  checkov, the venv's own set-up;
- e2e/: the cluster path on real containers (podman images, the node agent, the operator pod) and a
  real Prometheus scraping a real run.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# `cluster_session` and `kube`: the real control plane, started on first use, once per session.
pytest_plugins = ["bed.cluster_fixtures"]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

_EXAMPLE = yaml.safe_load((REPO / "examples" / "cartpole-ppo.yaml").read_text())


LAYERS = ("unit", "integration", "e2e")
#: The order a run starts the layers in: with workers (`pytest -n`, as ./scripts/test runs), the longest
#: units of work first, so none of them is left to run alone at the end.
START_ORDER = ("e2e", "integration", "unit")
#: The longest modules first (measured: bench/results/ci.json), before the rest of their layer, so none of
#: them is left to run alone at the end.
LONGEST_FIRST = ("test_e2e_faults", "test_e2e_cluster", "test_real_node", "test_e2e_concurrency", "test_e2e_kueue")


def _start_key(item: pytest.Item) -> tuple[int, int]:
    layer, module = item.path.parent.name, item.path.stem
    return (START_ORDER.index(layer) if layer in START_ORDER else len(START_ORDER),
            LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = item.path.parent.name
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
    items.sort(key=_start_key)


#: At most one end-to-end module at a time while other tests are queued: each starts a one-node cluster
#: whose pods train, and two of them beside the other layers' tests on two cores starved each other's pods
#: (before Ray's nodes started lean: a Ray head that exited, a gang restarted in a new epoch).
BEDS_AT_ONCE = 1
#: Once only end-to-end modules are queued, a second bed: otherwise the run's last part is one bed's chain
#: with a core to spare (bench/results/ci.json: for the last quarter of a warm run only one bed ran). Never
#: more than a machine's real node slots (tests/bed/real_node_config.py, NODE_SLOTS): a bed waits for one.
BEDS_WHEN_ONLY_BEDS_LEFT = 2


def is_end_to_end(nodeid: str) -> bool:
    return nodeid.startswith("tests/e2e/")


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without workers (`-p no:xdist`) has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Workers (`pytest -n N`, as ./scripts/test runs) take whole test modules, so a module's fixtures (a
    training run several tests read, a cluster bed) are made once and two of its tests never race for its
    namespace or files. The queue is in collection order (end-to-end modules first), but a worker skips an
    end-to-end module while the beds allowed at once run elsewhere."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            # Each other worker's end-to-end modules not yet done (a worker holds its next module before its
            # last test ends): a worker holding any holds a bed.
            beds = [[scope for scope, done in units.items() if is_end_to_end(scope) and not all(done.values())]
                    for other, units in self.assigned_work.items() if other is not node]
            others_queued = any(not is_end_to_end(scope) for scope in self.workqueue)
            beds_free = sum(1 for held in beds if held) < (BEDS_AT_ONCE if others_queued else BEDS_WHEN_ONLY_BEDS_LEFT)
            first = next((scope for scope in self.workqueue if not is_end_to_end(scope) or beds_free), None)
            if first is None:
                # Only beds are left and none may start now: this worker is done, the others take the rest.
                node.shutdown()
                return
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return ByModule(config, log)


@pytest.fixture
def one_torch_thread():
    """Tiny networks: more threads only contend on a shared machine (2 threads ran 30x slower). Tests
    that train them use it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch  # here, not at the top: not every test process needs torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def local_ray():
    """An embedded Ray with two rollout slots for a module's runs, started fresh (a test before may have
    left one) and shut down after the module."""
    import ray

    from kuberl.trainer.workers import start_ray

    if ray.is_initialized():
        ray.shutdown()
    start_ray(None, local_slots=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory):
    """A real S3-compatible store (SeaweedFS, tests/s3_store.py) on loopback for this test process; tests
    share its one bucket, each under a prefix of its own."""
    from s3_store import SeaweedFS

    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as store:
        yield store


@pytest.fixture
def job_dict() -> dict:
    """The CartPole PPO example as a dict, safe to mutate."""
    return copy.deepcopy(_EXAMPLE)


def job_pods(job, options) -> list[dict]:
    """Every pod the operator makes for a fresh job: head, learner and k rollout workers, in that order."""
    from kuberl.operator import builders

    return [
        builders.build_head_pod(job, options),
        builders.build_learner_pod(job, options),
        *(builders.build_worker_pod(job, options, i) for i in range(job.spec.rollout_workers.replicas)),
    ]

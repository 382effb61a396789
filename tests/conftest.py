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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = item.path.parent.name
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
    items.sort(key=lambda item: START_ORDER.index(item.path.parent.name)
               if item.path.parent.name in START_ORDER else len(START_ORDER))


def work_unit(nodeid: str) -> str:
    """What one worker runs, one test after another: a test module, so that its module-scoped fixtures (a
    training run several tests read) are made once and two of its tests never race for its namespace or
    files; and every end-to-end module together, since each starts a one-node cluster whose pods train,
    and two such beds at once on a small machine only slow each other down."""
    path = nodeid.split("::", 1)[0]
    return "tests/e2e" if path.startswith("tests/e2e/") else path


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Workers (`pytest -n N`) take whole work units (`work_unit`), in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


@pytest.fixture
def one_torch_thread():
    """Tiny networks: more threads only contend on a shared machine (2 threads ran 30x slower). Tests
    that train them use it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch  # here, not at the top: not every test process needs torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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

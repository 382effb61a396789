"""Data-parallel learners on a cluster: the operator runs ranks 1..N-1 as learner pods (Ray nodes with one
learner slot, the learner's resources, restricted Pod Security, inside the job's NetworkPolicy), replaces
one that ends, and deletes ranks past N; rank 0 stays `<job>-learner`."""

from __future__ import annotations

import json

from kuberl.api.load import parse_job
from kuberl.operator import builders
from kuberl.operator.builders import BuildOptions
from kuberl.operator.names import Component
from pod_security import assert_restricted
from test_operator_lifecycle import Sim, running


def _replicas(job_dict: dict, n: int, **learner) -> dict:
    job_dict["spec"]["learner"] = {"replicas": n, **learner}
    job_dict["spec"]["rolloutWorkers"]["replicas"] = 2
    return job_dict


def test_learner_replica_pod_is_a_ray_node_with_one_learner_slot_and_the_learners_gpu(job_dict):
    job = parse_job(_replicas(job_dict, 3, resources={"limits": {"nvidia.com/gpu": "1", "memory": "4Gi"}},
                              nodeSelector={"pool": "gpu"}))
    assert builders.learner_pods(job) == 3
    pod = builders.build_learner_replica_pod(job, BuildOptions(), 2, epoch=1)
    assert pod["metadata"]["name"] == "cartpole-ppo-learner-2"
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == Component.LEARNER_REPLICA.value
    container = pod["spec"]["containers"][0]
    command = container["command"]
    assert command[:3] == ["python3", "-m", "kuberl.trainer.ray_node"]
    assert "--block" in command and "--num-cpus=0" in command
    resources = json.loads(next(c for c in command if c.startswith("--resources="))[len("--resources="):])
    assert resources == {"learner_slot": 1}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert {e["name"] for e in container["env"]} >= {"KUBERL_RAY_ADDRESS", "RAY_AUTH_TOKEN"}
    assert_restricted(pod)
    ray_policy = builders.build_network_policies(job)[0]
    components = next(e for e in ray_policy["spec"]["podSelector"]["matchExpressions"]
                      if e["key"].endswith("component"))["values"]
    assert Component.LEARNER_REPLICA.value in components  # its ports: only from the job's own pods


def test_one_learner_has_no_replica_pods(job_dict):
    sim = running(Sim(_replicas(job_dict, 1)))
    assert not [n for n in sim.names() if "-learner-" in n]


def test_replicas_are_created_replaced_when_they_end_and_deleted_past_n(job_dict):
    sim = running(Sim(_replicas(job_dict, 3)))
    assert "cartpole-ppo-learner" in sim.names()
    assert {"cartpole-ppo-learner-1", "cartpole-ppo-learner-2"} <= set(sim.names())
    learner_uid = sim.pods["cartpole-ppo-learner"]["metadata"]["uid"]
    sim.set("cartpole-ppo-learner-1", "Failed")
    plan = sim.step()
    assert [p.name for p in plan.delete] == ["cartpole-ppo-learner-1"]
    assert any(e.reason == "LearnerReplicaReplaced" for e in plan.events)
    plan = sim.step()
    assert [m["metadata"]["name"] for m in plan.create] == ["cartpole-ppo-learner-1"]
    # Rank 0 is not touched by the operator: its process group fails and it restarts (counted) by itself.
    assert sim.pods["cartpole-ppo-learner"]["metadata"]["uid"] == learner_uid
    sim.run_all()
    assert sim.pods["cartpole-ppo-learner"]["metadata"]["annotations"]["kuberl.dev/learner-replicas"] == "3"


def test_changing_replicas_restarts_rank_0_uncounted_then_drops_the_ranks_past_n(job_dict):
    sim = running(Sim(_replicas(job_dict, 3)))
    sim.job_dict["spec"]["learner"]["replicas"] = 2
    plan = sim.step()
    # Rank 0 first (SIGTERM: it checkpoints its iteration while rank 2 still trains with it) ...
    assert [p.name for p in plan.delete] == ["cartpole-ppo-learner"]
    assert any(e.reason == "LearnersRescaled" and "3 -> 2" in e.message for e in plan.events)
    plan = sim.step()
    # ... then rank 2, and rank 0 comes back with N = 2, not counted as a restart.
    assert [p.name for p in plan.delete] == ["cartpole-ppo-learner-2"]
    assert [m["metadata"]["name"] for m in plan.create] == ["cartpole-ppo-learner"]
    assert plan.create[0]["metadata"]["annotations"]["kuberl.dev/learner-replicas"] == "2"
    sim.run_all()
    sim.step()
    assert sim.status.learner_restarts == 0
    assert sorted(n for n in sim.names() if "learner" in n) == ["cartpole-ppo-learner", "cartpole-ppo-learner-1"]
    sim.job_dict["spec"]["learner"]["replicas"] = 3  # up: rank 2's pod, and rank 0 restarts to use it
    plan = sim.step()
    assert [m["metadata"]["name"] for m in plan.create] == ["cartpole-ppo-learner-2"]
    assert [p.name for p in plan.delete] == ["cartpole-ppo-learner"]

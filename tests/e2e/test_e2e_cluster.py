"""
The cluster path, executed: the real images, the operator from its image, every pod a real container.

One bed per module (tests/bed/cluster_bed.py): the real control plane, a real node (a kubelet with
containerd, kube-proxy, CoreDNS and kube-router enforcing the jobs' NetworkPolicies: tests/bed/real_node.py),
the chart installed with helm (the operator runs as its Deployment, with its ServiceAccount's token), and
Debian's Prometheus discovering pods by their annotations. Each test then acts as a user with kubectl
only, and checks what the user would: columns in `kubectl get rltj`, `kubectl wait`, `kubectl logs`,
`kubectl exec`, status figures, the checkpoint claim, every dashboard panel, and that `kubectl delete`
leaves no container behind; what only the node shows (a container's user, mounts and environment) is read
from containerd as a node's admin would.

The node has this machine's two cores, and the scheduler places pods by their requests: every job asks
for a few hundred millicores a pod (`SMALL`), as a user on a 2-core node must (the examples' defaults, a
CPU for the learner and each worker, would leave a job Pending).

Mode: containers under containerd, driven by a real kubelet (this file has no local-process mode; the
operator/kubelet tests without containers are in test_operator_integration.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from bed.cluster_bed import SMALL_REQUESTS, OneNodeCluster, bed_for_tests
from bed.common import wait_until
from tools import file_lock

from kuberl.operator.names import DEFAULT_TRAINER_IMAGE

REPO = Path(__file__).resolve().parents[2]
NS = "ml-jobs"

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with bed_for_tests(tmp_path_factory.mktemp("bed"), namespaces=(NS,), prometheus=True) as running:
        yield running


#: The bed's small requests (cluster_bed.SMALL_REQUESTS) as this module's spec changes.
SMALL = {f"{role}.resources": resources for role, resources in SMALL_REQUESTS.items()}


def example(name: str, **spec_changes) -> dict:
    job = yaml.safe_load((REPO / "examples" / name).read_text())
    job["metadata"]["namespace"] = NS
    change(job["spec"], **{**SMALL, **spec_changes})
    return job


def change(spec: dict, **changes) -> None:
    """Each dotted path of `changes` set in `spec`."""
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value


def apply(bed: OneNodeCluster, *docs: dict) -> None:
    # As JSON documents: PyYAML would write a key N plain, which kubectl's YAML 1.1 reads as false.
    bed.kubectl("apply", "--validate=false", "-f", "-", input="\n---\n".join(json.dumps(doc) for doc in docs))


def claim(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


class Watch:
    """`kubectl get rltj -w` for the length of a test: every row it printed (the header, then NAME's)."""

    def __init__(self, bed: OneNodeCluster, name: str):
        self.name = name
        self.proc = subprocess.Popen(["kubectl", "get", "rltj", "-n", NS, "-w"], env=bed.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(("NAME ", f"{self.name} ")):
                self.lines.append(line.rstrip("\n"))

    def stop(self, last_phase: str | None = None) -> list[str]:
        """The rows so far; with `last_phase`, once a row in that phase came. A watch's event may arrive after a
        read of the job that already shows it: stopping at once could miss the row."""
        if last_phase is not None:
            wait_until(lambda: any(row.split()[1:2] == [last_phase] for row in self.lines[1:]), timeout=60,
                       what=f"`kubectl get rltj -w` to print {self.name} {last_phase}")
        self.proc.terminate()
        self.proc.wait(10)
        self.thread.join(10)
        return self.lines


def http_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def job_containers(bed: OneNodeCluster, job: str) -> list[str]:
    """The job's running containers. An exited one stays listed until the kubelet's garbage collection
    (each minute) removes it, as on any node: what a deleted job must not leave is a container that runs."""
    return [n for n in bed.bed_containers() if f"_{job}-" in n and f"_{NS}_" in n]


def delete_and_check_nothing_left(bed: OneNodeCluster, job: str) -> None:
    bed.kubectl("delete", "rltj", job, "-n", NS, "--wait=true", "--timeout=120s")
    wait_until(lambda: not bed.cluster.list("pods", NS, label_selector=f"kuberl.dev/job-name={job}"), 120, 0.2,
               f"the pods of {job} to be gone")
    wait_until(lambda: not job_containers(bed, job), 120, 0.2, f"the containers of {job} to be gone")


def learner_figures(bed: OneNodeCluster, job: str) -> dict:
    return bed.cluster.get("rltj", job, NS)["status"]


def wait_complete(bed: OneNodeCluster, job: str, timeout: int) -> None:
    bed.wait_complete(NS, job, timeout)


# --------------------------------------------------------------------------------------------------


def test_cartpole_ppo_trains_on_the_cluster_as_a_user_runs_it(bed):
    from test_dashboard import dashboard, grafana_expr, has_finite_value, queries

    # Checkpoints every 10 iterations (of ~100): the checkpoint-age panel has a checkpoint to show while
    # the learner is still being scraped, not only the final one written just before it exits.
    job = example("cartpole-ppo.yaml", **{"checkpointing.volume.claimName": "cartpole-checkpoints",
                                          "checkpointing.intervalIterations": 10,
                                          "serving": {"replicas": 1}})
    apply(bed, claim("cartpole-checkpoints"))
    watch = Watch(bed, "cartpole-ppo")
    started = time.time()
    apply(bed, job)
    wait_complete(bed, "cartpole-ppo", 600)
    rows = watch.stop("Succeeded")

    # kubectl get rltj: the columns fill in while it trains, and end Succeeded with the final figures.
    header, *states = [r.split() for r in rows]
    assert header[:3] == ["NAME", "PHASE", "WORKERS"], rows
    # The first rows come before the operator wrote any status: empty columns, the name and age only.
    states = [r for r in states if len(r) >= 4]
    running = [r for r in states if r[1] == "Running"]
    assert running and any(r[2] == "2/2" for r in running), rows
    assert any(int(r[3]) > 0 for r in running), f"no Running row with episodes: {rows}"
    assert states[-1][1] == "Succeeded", rows

    status = learner_figures(bed, "cartpole-ppo")
    progress = status["progress"]
    assert progress["meanReturn"] >= 475, status
    assert progress["envSteps"] > 0 and progress["episodes"] > 0 and progress["gradientUpdates"] > 0, status
    assert status["evaluation"]["deterministic"]["meanReturn"] == 500, status
    assert status["lastCheckpointTime"], status
    # From kubectl apply to the learner's first env steps: inside the job's life, and in the wide columns.
    found = bed.cluster.get("rltj", "cartpole-ppo", NS)
    life = (datetime.fromisoformat(status["completionTime"].replace("Z", "+00:00"))
            - datetime.fromisoformat(found["metadata"]["creationTimestamp"].replace("Z", "+00:00"))).total_seconds()
    assert 0 < status["timeToFirstStepSeconds"] < life, (status, life)
    wide = bed.kubectl("get", "rltj", "-n", NS, "cartpole-ppo", "-o", "wide").stdout.splitlines()
    assert "FIRST-STEP" in wide[0].split() and f"{status['timeToFirstStepSeconds']:g}" in wide[1].split(), wide

    # kubectl logs of the learner: what it printed in its container.
    logs = bed.kubectl("logs", "-n", NS, "cartpole-ppo-learner").stdout
    assert "ray joined" in logs or "joined" in logs, logs[-2000:]
    # Its thread pools sized to the pod's one CPU (its request), not the node's cores.
    assert "torch threads: 1 (container CPUs: 1)" in logs, logs[-2000:]

    # The run directory is on the claim: it outlives the learner pod.
    run_dir = bed.node.claim_dir(NS, "cartpole-checkpoints")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluation"]["mean_return"] == 500 if "mean_return" in summary.get("evaluation", {}) else True
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.pt")), list(run_dir.iterdir())
    assert (run_dir / "evaluation.json").exists() and (run_dir / "metrics.jsonl").exists()
    # TensorBoard's reader loads the learner's event files from the claim: a point per metrics row.
    from tensorboard_events import read_events

    metric_rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [e.step for e in read_events(run_dir / "tensorboard").Scalars("rollout/mean_return")]
    assert steps == [r["env_steps"] for r in metric_rows if r["mean_return"] is not None], steps

    # Prometheus found the learner pod by its annotations; every dashboard panel has data at the
    # moment of the learner's last scrape (its pod is Succeeded now: the series ended there).
    last = bed.prometheus_query(f'timestamp(kuberl_episodes_total{{namespace="{NS}",job_name="cartpole-ppo"}})'
                                "[10m:1s]")
    assert last, "Prometheus never scraped the learner pod"
    scraped_at = max(float(v[1]) for series in last for v in series["values"])
    assert scraped_at >= started
    selected = {"namespace": NS, "job_name": "cartpole-ppo", "datasource": "prometheus"}
    empty = {title: expr for title, expr in
             ((t, grafana_expr(e, selected, "1m")) for t, e in queries(dashboard()))
             if not has_finite_value(bed.prometheus_query(expr, at=scraped_at))}
    assert not empty, f"dashboard panels without data: {json.dumps(empty, indent=1)}"

    # spec.serving: once the job succeeded, the operator made a Deployment serving the policy from the
    # claim. Its pod (made by the Deployment's ReplicaSet) runs the trainer image, restricted, and answers.
    assert status["servingEndpoint"] == f"http://cartpole-ppo-serving.{NS}.svc:8000", status
    (serving_pod,) = bed.deployment_pods(NS, "cartpole-ppo-serving")
    ip = bed.wait_pod_ready(NS, serving_pod, 180)["status"]["podIP"]  # readiness: /v2/health/ready
    answer = http_json(f"http://{ip}:8000/act", {"observation": [0.0, 0.0, 0.15, 1.0]})
    assert answer["action"] == 1, answer  # pole leaning and falling right: push right
    infer = http_json(f"http://{ip}:8000/v2/models/cartpole-ppo/infer", {"inputs": [
        {"name": "observation", "shape": [2, 4], "datatype": "FP32",
         "data": [0.0, 0.0, 0.15, 1.0, 0.0, 0.0, -0.15, -1.0]}]})
    assert infer["outputs"][0]["data"] == [1, 0], infer

    delete_and_check_nothing_left(bed, "cartpole-ppo")
    assert bed.cluster.get("deployments", "cartpole-ppo-serving", NS) is None
    assert not [n for n in bed.bed_containers() if "cartpole-ppo-serving" in n]
    assert (run_dir / "summary.json").exists(), "the claim's data must outlive the job"


def test_a_sweep_applied_with_kubectl_trains_its_trials_as_child_jobs_to_the_end(bed):
    """The example sweep, cut to two learning rates, one seed and a short budget, applied as a user applies it:
    the operator runs each trial as a child RLTrainingJob whose pods train in real containers, reads each
    trial's result from its job, ranks the two, and the sweep completes; deleting it deletes its trials."""
    lr = "algorithm.ppo.learningRate"
    sweep = yaml.safe_load((REPO / "examples" / "sweeps" / "cartpole-ppo-lr.yaml").read_text())
    name = sweep["metadata"]["name"]
    sweep["metadata"]["namespace"] = NS
    spec = sweep["spec"]
    spec["parameters"] = [{"path": lr, "values": [0.0025, 0.01]}]
    spec["seeds"], spec["maxTrials"], spec["parallelism"] = 1, 2, 2
    spec["template"]["stopping"]["maxEnvSteps"] = 4000
    change(spec["template"], **SMALL)  # two trials at once on the node's two cores
    apply(bed, sweep)
    bed.kubectl("wait", "-n", NS, "--for=condition=Complete", f"rlsweep/{name}", "--timeout=600s", timeout=620)

    found = bed.cluster.get("rlsweeps", name, NS)
    status = found["status"]
    assert status["phase"] == "Succeeded" and status["progress"] == "2/2", status
    assert sorted(t["parameters"][lr] for t in status["trials"]) == [0.0025, 0.01], status["trials"]
    for trial in status["trials"]:
        job = bed.cluster.get("rltj", trial["name"], NS)
        assert job["status"]["phase"] == "Succeeded", (trial, job["status"])
        assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == [found["metadata"]["uid"]]
        assert job["spec"]["algorithm"]["ppo"]["learningRate"] == trial["parameters"][lr]
        # What the sweep recorded is the trial job's own final figures.
        assert trial["state"] == "Succeeded" and trial["envSteps"] == job["status"]["progress"]["envSteps"] >= 4000
        assert trial["objective"] is not None and trial["meanReturn"] == job["status"]["progress"]["meanReturn"]
    assert len(status["ranking"]) == 2 and status["best"] == status["ranking"][0], status
    row = bed.kubectl("get", "rlsweep", "-n", NS, name).stdout.splitlines()[1].split()
    assert row[:3] == [name, "Succeeded", "2/2"], row

    bed.kubectl("delete", "rlsweep", "-n", NS, name, "--wait=true", timeout=120)
    wait_until(lambda: not [j for j in bed.cluster.list("rltj", NS) if j["metadata"]["name"].startswith(f"{name}-t")],
               timeout=120, what="the sweep's trial jobs gone with it")


def test_tictactoe_self_play_example_with_its_evaluation_suites(bed):
    job = example("tictactoe-dqn.yaml")
    apply(bed, job)
    wait_complete(bed, "tictactoe-dqn", 900)
    status = learner_figures(bed, "tictactoe-dqn")
    evaluation = status["evaluation"]
    assert {"vs-random-first", "vs-random-second", "self-play"} <= set(evaluation), evaluation
    assert evaluation["vs-random-first"]["winRate"] >= 0.9, evaluation
    assert evaluation["vs-random-second"]["winRate"] >= 0.8, evaluation
    assert status["progress"]["episodes"] >= 100_000, status
    delete_and_check_nothing_left(bed, "tictactoe-dqn")


def test_a_job_with_four_rollout_workers(bed):
    # Four worker pods, one rollout actor on each, and a learner that still learns from them. Training to
    # the example's 475 on the cluster is test_cartpole_ppo_trains_on_the_cluster_as_a_user_runs_it's
    # claim; here CartPole's 195 ("solved" in gymnasium's v0) is enough, and four workers' pods on two
    # cores took minutes more to reach 475.
    # Every pod held to one CPU by a limit (a cgroup quota on its container) on a node of more cores: each
    # process's thread pools are sized to that one CPU, not to the node's cores.
    assert len(os.sched_getaffinity(0)) > 1, "the thread check needs a node with more cores than the pods' limit"
    one_cpu = {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    job = example("cartpole-ppo.yaml", **{"rolloutWorkers.replicas": 4, "rolloutWorkers.envsPerWorker": 4,
                                          "rolloutWorkers.resources": one_cpu, "learner.resources": one_cpu,
                                          "stopping.targetReturn": 195, "evaluation.episodes": 5})
    job["metadata"]["name"] = "cartpole-four"
    watch = Watch(bed, "cartpole-four")
    apply(bed, job)
    # The head and the workers run the rollout image, which has no torch; only the learner's has it.
    from bed.cluster_bed import ROLLOUT_IMAGE, TRAINER_IMAGE

    pods = wait_until(lambda: p if len(p := job_pods(bed, "cartpole-four")) == 6 else None, 60, 0.2,
                      "the six pods of cartpole-four")
    images = {(pod["metadata"]["labels"]["kuberl.dev/component"], pod["spec"]["containers"][0]["image"])
              for pod in pods}
    assert images == {("head", ROLLOUT_IMAGE), ("rollout-worker", ROLLOUT_IMAGE), ("learner", TRAINER_IMAGE)}
    no_torch = bed.podman("run", "--rm", "--network", "none", "--entrypoint", "python3", ROLLOUT_IMAGE, "-c",
                          "import torch", check=False)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr, no_torch
    wait_complete(bed, "cartpole-four", 600)
    rows = [r.split() for r in watch.stop("Succeeded")]
    assert any(r[1] == "Running" and r[2] == "4/4" for r in rows[1:]), rows
    status = learner_figures(bed, "cartpole-four")
    assert status["workersDesired"] == 4, status
    assert status["progress"]["meanReturn"] >= 195, status
    # The learner placed one rollout actor on each of the four worker pods (Ray nodes).
    logs = bed.kubectl("logs", "-n", NS, "cartpole-four-learner").stdout
    # The learner waits 60 s at its start for every worker; on a loaded machine a worker's Ray node may join
    # after that, and the learner places its actor then. Each worker's own ready line below is what shows it
    # was placed, whichever came first.
    assert re.search(r"[0-4]/4 rollout workers ready", logs), logs[-3000:]
    assert "torch threads: 1 (container CPUs: 1)" in logs, logs[-3000:]
    # Each rollout worker's own process, in its own container, says what it computes with.
    pools = "thread pools OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
    for index in range(4):
        assert f"rollout worker {index} ready: container CPUs 1, {pools}" in logs, logs[-3000:]
    delete_and_check_nothing_left(bed, "cartpole-four")


def test_two_data_parallel_learners_train_to_complete(bed):
    # spec.learner.replicas: 2: rank 0 is cartpole-ddp-learner, rank 1 the learner pod cartpole-ddp-learner-1
    # (a Ray node with one learner slot); the two average gradients over gloo between the containers.
    job = example("cartpole-ppo.yaml", **{"learner.replicas": 2, "rolloutWorkers.envsPerWorker": 4,
                                          "stopping.targetReturn": 195, "evaluation.episodes": 5})
    job["metadata"]["name"] = "cartpole-ddp"
    apply(bed, job)
    bed.cluster.wait_for("pods", "cartpole-ddp-learner-1", namespace=NS, timeout=60)
    wait_complete(bed, "cartpole-ddp", 600)
    status = learner_figures(bed, "cartpole-ddp")
    restarts = [e["message"] for e in job_events(bed, "cartpole-ddp") if e["reason"] == "LearnerRestarted"]
    assert status["progress"]["meanReturn"] >= 195 and status["learnerRestarts"] == 0, (status, restarts)
    logs = bed.kubectl("logs", "-n", NS, "cartpole-ddp-learner").stdout
    assert "2 data-parallel learners joined (gloo" in logs, logs[-3000:]
    delete_and_check_nothing_left(bed, "cartpole-ddp")


def test_sac_from_its_example_trains_pendulum_to_complete_on_the_cluster(bed):
    """Continuous control on the cluster: the rollout worker pod acts with the numpy squashed-Gaussian actor,
    the learner pod keeps the replay and updates. A short budget: the cluster path, not the learning (the
    integration tests show that)."""
    job = example("pendulum-sac.yaml", **{
        "algorithm": {"name": "SAC", "sac": {"learningStarts": 256, "batchSize": 64,
                                             "network": {"hiddenSizes": [64, 64]}}},
        "rolloutWorkers.envsPerWorker": 4, "stopping": {"maxEnvSteps": 1024}, "evaluation": {"episodes": 2}})
    apply(bed, job)
    wait_complete(bed, "pendulum-sac", 600)
    status = learner_figures(bed, "pendulum-sac")
    progress = status["progress"]
    # Replay ratio 1 (CleanRL's one update per env step) after the random warm-up.
    assert progress["envSteps"] >= 1024 and progress["gradientUpdates"] >= 1024 - 2 * 256, status
    assert -2000 < status["evaluation"]["deterministic"]["meanReturn"] < 0, status  # Pendulum's range
    delete_and_check_nothing_left(bed, "pendulum-sac")


def test_many_agents_from_the_spread_example_train_to_complete_on_the_cluster(bed):
    """PettingZoo on the cluster: every pod runs the trainer image the example names (MPE needs more than the
    rollout image holds), each rollout worker pod steps a vector of agents with the shared numpy policy, and
    the learner's figures count agent steps and agent episodes."""
    job = example("spread-ppo.yaml", **{"stopping": {"maxEnvSteps": 6_000}, "evaluation": {"episodes": 2}})
    apply(bed, job)
    def all_four() -> list[dict] | None:
        found = bed.cluster.list("pods", NS, label_selector="kuberl.dev/job-name=spread-ppo")
        return found if len(found) == 4 else None

    pods = wait_until(all_four, 120, 0.2, "the head, the learner and the two workers of spread-ppo")
    assert {c["image"] for pod in pods for c in pod["spec"]["containers"]} == {DEFAULT_TRAINER_IMAGE}, pods
    wait_complete(bed, "spread-ppo", 600)
    status = learner_figures(bed, "spread-ppo")
    progress = status["progress"]
    # Three agents, 25 steps an episode: an agent's episode is 25 of its steps.
    assert progress["envSteps"] >= 6_000 and progress["episodes"] * 25 <= progress["envSteps"], status
    # simple_spread pays an agent minus the landmarks' distances each step: 25 steps of it, below 0.
    assert -100 < status["evaluation"]["deterministic"]["meanReturn"] < 0, status
    delete_and_check_nothing_left(bed, "spread-ppo")


def test_policy_groups_from_the_adversary_example_train_to_complete_on_the_cluster(bed):
    """Policy groups on the cluster: each rollout worker pod acts for the adversary and the good agents with
    their groups' own policies, and the learner reports each group's return. A short budget: the claim here is
    the path, learning is the integration test's."""
    job = example("adversary-ppo-groups.yaml", **{"stopping": {"maxEnvSteps": 6_000}, "evaluation": {"episodes": 2}})
    apply(bed, job)
    wait_complete(bed, "adversary-ppo-groups", 600)
    progress = learner_figures(bed, "adversary-ppo-groups")["progress"]
    assert progress["envSteps"] >= 6_000 and progress["episodes"] * 25 <= progress["envSteps"], progress
    assert set(progress["returnsByPolicy"]) == {"adversary", "good"}, progress
    # kubectl's wide view shows them, through the CRD's printer column as the API server renders it.
    wide = bed.kubectl("get", "rltj", "-n", NS, "adversary-ppo-groups", "-o", "wide").stdout.splitlines()
    assert "POLICY-RETURNS" in wide[0].split(), wide
    assert re.search(r'\{"adversary":-?[0-9.]+,"good":-?[0-9.]+\}', wide[1]), wide
    logs = bed.kubectl("logs", "-n", NS, "adversary-ppo-groups-learner").stdout
    assert re.search(r"evaluation by policy\s*│\s*adversary -?[0-9.]+, good -?[0-9.]+", logs), logs[-3000:]
    delete_and_check_nothing_left(bed, "adversary-ppo-groups")


def test_self_play_in_a_pettingzoo_game_trains_to_complete_on_the_cluster(bed):
    """A turn-based PettingZoo game under policies: selfPlay on the cluster: the rollout worker pod plays the
    learner's seat of each game against its frozen copies, and the suites count games seat by seat from the
    learner's status. A short budget: the claim here is the path, learning is the integration test's."""
    job = example("tictactoe-selfplay-dqn.yaml", **{"stopping": {"maxEnvSteps": 8_000}, "evaluation": {
        "episodes": 20, "suites": [{"name": "vs-random-second", "kind": "opponent", "opponent": "random",
                                    "agentFirst": False, "episodes": 50}]}})
    apply(bed, job)
    wait_complete(bed, "tictactoe-selfplay-dqn", 600)
    status = learner_figures(bed, "tictactoe-selfplay-dqn")
    progress, evaluation = status["progress"], status["evaluation"]
    # A game is 3 to 5 of the learner's moves; the opponent's moves are not env steps.
    assert progress["envSteps"] >= 8_000 and 3 * progress["episodes"] <= progress["envSteps"] <= 5 * \
        progress["episodes"], status
    assert set(evaluation) == {"deterministic", "vs-random-second"}, evaluation
    assert 0 <= evaluation["vs-random-second"]["winRate"] <= 1, evaluation
    # A game's return is its outcome for the learner's seat: -1, 0 or 1.
    assert -1 <= evaluation["deterministic"]["meanReturn"] <= 1, evaluation
    delete_and_check_nothing_left(bed, "tictactoe-selfplay-dqn")


def test_bdq_preference_pairs_from_a_config_map_reach_the_learner(bed):
    """The operator mounts spec.algorithm.bdq.preference.configMap into the learner pod; the learner
    reads its pairs.jsonl while training and skips what it cannot use (no crash), saying why."""
    pairs = '{"a": "feed0001a", "b": "feed0001b", "prefer": "a"}\nnot json\n'
    apply(bed, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ranked-pairs", "namespace": NS},
                "data": {"pairs.jsonl": pairs}})
    job = example("autoscaling-bdq.yaml", **{
        "algorithm.bdq.preference.configMap": "ranked-pairs", "algorithm.bdq.learningStarts": 500,
        "stopping": {"maxEnvSteps": 3000}, "evaluation": {"enabled": False},
        "rolloutWorkers.replicas": 1, "collection": {"mode": "sync", "fragmentSteps": 32}})
    job["metadata"]["name"] = "autoscaling-pref"
    apply(bed, job)
    wait_complete(bed, "autoscaling-pref", 600)
    logs = bed.kubectl("logs", "-n", NS, "autoscaling-pref-learner").stdout
    assert "preference pairs: reading /etc/kuberl/preferences/pairs.jsonl" in logs, logs[-3000:]
    assert "unknown segment id 'feed0001a'" in logs and "line skipped: not JSON" in logs, logs[-3000:]
    delete_and_check_nothing_left(bed, "autoscaling-pref")
    bed.kubectl("delete", "configmap", "ranked-pairs", "-n", NS)


# ---- the trust boundary, on real containers --------------------------------------------------------------

_GCS_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    keys = GcsClient(address=sys.argv[1]).internal_kv_keys(b"", None, timeout=10)
    print("ADMITTED", len(keys))
except Exception as err:
    print("REFUSED", type(err).__name__, err)
"""


def _inside_the_job(bed: OneNodeCluster, script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a Python script in the ray-token job's first rollout worker (`kubectl exec`), without the job's
    token, or with `env`'s: a process inside the job's NetworkPolicies, which refuse any pod outside the
    job at the Ray ports (test_real_node.py), so what admits or refuses it here is Ray's token alone."""
    settings = [f"{k}={v}" for k, v in (env or {}).items()]
    result = bed.kubectl("exec", "-n", NS, "ray-token-worker-0", "-c", "rollout-worker", "--", "env", "-u",
                         "RAY_AUTH_TOKEN", "-u", "RAY_AUTH_MODE", *settings, "python3", "-c", script, *args,
                         check=False, timeout=120)
    return result.stdout + result.stderr


def test_a_jobs_ray_cluster_admits_only_its_own_token_and_the_job_still_trains(bed):
    import base64

    job = example("cartpole-ppo.yaml", **{
        # A simulator with a speed limit (at most 2 x 8 envs / 5 ms): the head is up for the whole probe.
        "environment": {"id": "kuberl.trainer.envs.latency:LatencyEnv",
                        "kwargs": {"step_seconds": 0.005, "episode_steps": 200}},
        "stopping": {"targetReturn": 10_000, "maxEnvSteps": 60_000, "maxWallClockSeconds": 600},
        "evaluation": {"episodes": 2}})
    job["metadata"]["name"] = "ray-token"
    apply(bed, job)
    bed.cluster.wait_for("rltj", "ray-token", namespace=NS, timeout=300,
                         predicate=lambda obj: (obj.get("status") or {}).get("phase") == "Running")
    head_ip = bed.pod(NS, "ray-token-head")["status"]["podIP"]
    address = f"{head_ip}:6379"

    # A process without the token: Ray's own client is refused by the job's head.
    refused = _inside_the_job(bed, _GCS_PROBE, address)
    assert "REFUSED AuthenticationError" in refused and "Authentication token is missing or incorrect" in refused, \
        refused
    wrong = _inside_the_job(bed, _GCS_PROBE, address, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})
    assert "REFUSED AuthenticationError" in wrong, wrong
    # The same client with the job's token (read as the cluster's admin, which the operator is not) is
    # admitted: the refusals above are the token's doing.
    secret = bed.cluster.get("secrets", "ray-token-ray-token", NS)
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 64 and token not in json.dumps(bed.cluster.get("pods", "ray-token-head", NS))
    admitted = _inside_the_job(bed, _GCS_PROBE, address, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    assert "ADMITTED" in admitted, admitted
    # Ray's dashboard (its job-submission API, which runs code) is not served at all: the head starts
    # without it, so nothing listens on its port.
    dashboard = _inside_the_job(bed, "import sys, urllib.request as u\ntry:\n u.urlopen(sys.argv[1], timeout=10)\n"
                               " print('OPEN')\nexcept Exception as err:\n print('CLOSED', err)\n",
                          f"http://{head_ip}:8265/api/jobs/")
    assert "CLOSED" in dashboard and "Connection refused" in dashboard, dashboard

    wait_complete(bed, "ray-token", 600)
    assert learner_figures(bed, "ray-token")["progress"]["envSteps"] >= 60_000
    delete_and_check_nothing_left(bed, "ray-token")


def test_a_spec_only_the_learner_can_check_fails_as_invalid_spec_with_validates_text(bed):
    """`subprocess:run` is not a registered id: the operator starts the job, and its learner pod (never
    the operator) refuses it before training, exit 2, kuberl validate's text as its termination message."""
    job = example("cartpole-ppo.yaml", **{"environment": {"id": "subprocess:run",
                                                          "kwargs": {"args": ["touch", "/tmp/ran"]}}})
    job["metadata"]["name"] = "tenant-code"
    apply(bed, job)
    status = bed.cluster.wait_for("rltj", "tenant-code", namespace=NS, timeout=300,
                                  predicate=lambda obj: (obj.get("status") or {}).get("phase") == "Failed")["status"]
    assert status["reason"] == "InvalidSpec", status
    assert status["message"].startswith("error: tenant-code is not a valid RLTrainingJob (1 problem(s)):"), status
    assert "spec.environment.id" in status["message"] and "gymnasium.Env subclass" in status["message"], status
    assert status["learnerRestarts"] == 0, status
    # The head and the workers are deleted; the learner stays for its log.
    wait_until(lambda: {p["metadata"]["name"] for p in bed.cluster.list(
        "pods", NS, label_selector="kuberl.dev/job-name=tenant-code")} == {"tenant-code-learner"}, 120, 0.2,
        "only the learner pod of tenant-code")
    logs = bed.kubectl("logs", "-n", NS, "tenant-code-learner").stdout
    assert "is not a valid RLTrainingJob" in logs, logs[-2000:]
    delete_and_check_nothing_left(bed, "tenant-code")


# -- Your own environment in your own image --------------------------------------------


GRIDGOAL = REPO / "tests" / "data" / "gridgoal"
GRIDGOAL_IMAGE = "localhost/kuberl/gridgoal-trainer:e2e"


def offline_wheels() -> Path | None:
    """The wheel cache scripts/build-images installs from (it holds the setuptools a package's build needs):
    this machine's builds have no network."""
    cache = Path(os.environ.get("KUBERL_CACHE") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kuberl")
    for wheels in sorted((cache / "wheels").glob("torch-*")):
        if (wheels / ".complete").exists() and any(wheels.glob("setuptools-*.whl")):
            return wheels
    return None


def build_user_image(tmp_path: Path) -> None:
    """`podman build` of tests/data/gridgoal/Dockerfile as docs/custom-environments.md has a user run it;
    offline, pip reads the wheel cache instead of an index (a pip.conf mounted for the build's RUN only)."""
    cmd = ["podman", "build", "--pull=never", "-t", GRIDGOAL_IMAGE]
    wheels = offline_wheels()
    if wheels is not None:
        conf = tmp_path / "pip.conf"
        conf.write_text("[global]\nno-index = true\nfind-links = /wheels\n")
        cmd += ["--network", "none", "-v", f"{wheels}:/wheels:ro", "-v", f"{conf}:/etc/pip.conf:ro"]
    with file_lock(REPO / ".cache" / "build-images.lock"):  # beside scripts/build-images, never during it
        built = subprocess.run([*cmd, str(GRIDGOAL)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]


def test_your_own_environment_in_your_own_image_trains_on_the_cluster(bed, tmp_path):
    """docs/custom-environments.md's path: a package with an env, an image FROM the trainer's that installs
    it, pushed to the cluster's registry, spec.image naming it there, environment.id naming the package's
    registered id. The same job on the stock image fails at once as InvalidSpec, naming the module and the
    image."""
    build_user_image(tmp_path)
    pushed = f"{bed.registry.address}/kuberl/gridgoal-trainer:e2e"
    try:
        push = subprocess.run(["podman", "push", "--tls-verify=false", GRIDGOAL_IMAGE, f"docker://{pushed}"],
                              capture_output=True, text=True, timeout=600)
        assert push.returncode == 0, push.stderr[-3000:]
        common = {"environment": {"id": "gridgoal:GridGoal-v0", "kwargs": {"size": 4}},
                  "rolloutWorkers.replicas": 1, "rolloutWorkers.envsPerWorker": 4,
                  "stopping": {"maxEnvSteps": 4096}, "evaluation": {"episodes": 4}}
        own = example("cartpole-ppo.yaml", image=pushed, **common)
        own["metadata"]["name"] = "own-env"
        stock = example("cartpole-ppo.yaml", **common)
        stock["metadata"]["name"] = "stock-image"
        apply(bed, own, stock)

        failed = bed.cluster.wait_for("rltj", "stock-image", namespace=NS, timeout=300,
                                      predicate=phase_is("Failed", "Succeeded"))["status"]
        assert failed["phase"] == "Failed" and failed["reason"] == "InvalidSpec", failed
        message = failed["message"]
        assert "spec.environment.id" in message and "module 'gridgoal'" in message, message
        assert "ghcr.io/kuberl/kuberl-trainer:0.1.0" in message and "spec.image" in message, message
        assert failed["learnerRestarts"] == 0, failed

        wait_complete(bed, "own-env", 600)
        status = learner_figures(bed, "own-env")
        assert status["progress"]["envSteps"] >= 4096 and status["progress"]["episodes"] > 0, status
        learner = bed.cluster.get("pods", "own-env-learner", NS)
        assert learner["spec"]["containers"][0]["image"] == pushed
        for job in ("stock-image", "own-env"):
            delete_and_check_nothing_left(bed, job)
    finally:
        subprocess.run(["podman", "rmi", "--force", GRIDGOAL_IMAGE], capture_output=True, timeout=120)


# -- A job that cannot start says why ----------------------------------------------


def job_pods(bed: OneNodeCluster, job: str) -> list[dict]:
    return bed.cluster.list("pods", NS, label_selector=f"kuberl.dev/job-name={job}")


def job_events(bed: OneNodeCluster, job: str) -> list[dict]:
    return [e for e in bed.cluster.list("events", NS) if (e.get("involvedObject") or {}).get("name") == job]


def phase_is(*phases: str):
    return lambda obj: (obj.get("status") or {}).get("phase") in phases


def test_an_image_that_does_not_exist_says_so_then_fails_at_the_startup_deadline(bed):
    job = example("cartpole-ppo.yaml", **{"image": "localhost/kuberl/no-such-trainer:0.0.0",
                                          "rolloutWorkers.replicas": 1, "startupDeadlineSeconds": 30})
    job["metadata"]["name"] = "no-image"
    apply(bed, job)
    starting = bed.cluster.wait_for("rltj", "no-image", namespace=NS, timeout=60, predicate=lambda obj: "ImagePullBackOff"
                                    in ((obj.get("status") or {}).get("message") or ""))["status"]
    assert starting["phase"] == "Starting", starting
    assert "localhost/kuberl/no-such-trainer:0.0.0" in starting["message"] and "check spec.image" in starting["message"]
    blocked = {c["type"]: c for c in starting["conditions"]}["StartupBlocked"]
    assert blocked["status"] == "True" and blocked["reason"] in ("ErrImagePull", "ImagePullBackOff"), blocked
    status = bed.cluster.wait_for("rltj", "no-image", namespace=NS, timeout=90, predicate=phase_is("Failed"))["status"]
    assert status["reason"] == "StartupDeadlineExceeded", status
    assert status["message"].startswith("the job was not Running within startupDeadlineSeconds (30 s)"), status
    assert "ImagePull" in status["message"], status
    wait_until(lambda: not job_pods(bed, "no-image"), 60, 0.2, "the pods of no-image to be deleted")
    # kopf posts Events from a queue of its own, so they may land after the status that caused them.
    reasons = wait_until(lambda: (r := [e["reason"] for e in job_events(bed, "no-image")]) and
                         "StartupDeadlineExceeded" in r and r, 60, 0.2, "the StartupDeadlineExceeded Event")
    assert {"ErrImagePull", "ImagePullBackOff"} & set(reasons), reasons
    delete_and_check_nothing_left(bed, "no-image")


def test_a_learner_that_exits_at_once_shows_its_last_log_lines(bed):
    """learner.device: cuda on a node without a GPU: the learner exits 1 before training (not the
    InvalidSpec exit 2: the spec is valid, the node is not what it asks for)."""
    job = example("cartpole-ppo.yaml", **{"learner.device": "cuda", "rolloutWorkers.replicas": 1,
                                          "backoffLimit": 0, "startupDeadlineSeconds": 300})
    job["metadata"]["name"] = "no-gpu"
    apply(bed, job)
    status = bed.cluster.wait_for("rltj", "no-gpu", namespace=NS, timeout=300, predicate=phase_is("Failed"))["status"]
    assert status["reason"] == "BackoffLimitExceeded", status
    assert "container learner exited with code 1" in status["message"], status
    # The learner's error line, from its termination message (the learner writes it: its pod's Ray node may
    # still log after the learner ended).
    assert "error: spec.learner.device is cuda but torch sees no CUDA device" in status["message"], status
    # The Event comes from kopf's own queue, possibly after the status.
    event = wait_until(lambda: next((e["message"] for e in job_events(bed, "no-gpu")
                                     if e["reason"] == "BackoffLimitExceeded"), None), 60, 0.2,
                       "the BackoffLimitExceeded Event")
    assert "sees no CUDA device" in event, event
    delete_and_check_nothing_left(bed, "no-gpu")


# ---- pod templates per role (spec.<role>.template), on real containers -------------------------------------


def _running_spec(bed: OneNodeCluster, container: str) -> dict:
    """The OCI runtime spec containerd runs `container` under, once it runs."""
    wait_until(lambda: any(c.name == container and c.running for c in bed.node.containers.list()), 120, 0.5,
               f"{container} running")
    return bed.node.containers.spec(container)


def own_tolerations(pod: dict) -> list[dict]:
    """A pod's tolerations less the two the API server's DefaultTolerationSeconds admission adds to
    every pod (not-ready and unreachable, NoExecute, 300 s)."""
    added = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    return [t for t in pod["spec"].get("tolerations") or []
            if not (t.get("key") in added and t.get("effect") == "NoExecute" and t.get("tolerationSeconds") == 300)]


@pytest.fixture
def mlflow_on_bed(bed, tmp_path):
    """A real `mlflow server` listening on the host's end of the node's link, which the bed's pods reach."""
    from tools import MLflowServer

    server = MLflowServer(tmp_path, host=bed.gateway)
    server.start()
    yield server
    server.stop()


def test_pod_templates_give_the_containers_tolerations_secret_env_volumes_and_a_sidecar(bed, mlflow_on_bed):
    """Also MLflow tracking from a learner pod: a real `mlflow server` on the host, where pods reach it, its
    token from the same Secret (spec.tracking.mlflow.credentialsSecret), the run read back with MLflow's
    own client."""
    import base64

    from bed.cluster_bed import TRAINER_IMAGE

    mlflow = mlflow_on_bed
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tracking", "namespace": NS},
              "type": "Opaque", "data": {"api-key": base64.b64encode(b"s3cr3t").decode(),
                                         "ENDPOINT": base64.b64encode(b"https://tracking.example").decode(),
                                         "token": base64.b64encode(b"t0ken").decode()}}
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    job = example("cartpole-ppo.yaml", **{
        # A simulator with a speed limit (as in the Ray token test): the job runs while its containers are read.
        "environment": {"id": "kuberl.trainer.envs.latency:LatencyEnv",
                        "kwargs": {"step_seconds": 0.005, "episode_steps": 200}},
        "stopping": {"targetReturn": 10_000, "maxEnvSteps": 60_000, "maxWallClockSeconds": 600},
        "evaluation": {"episodes": 2},
        "tracking": {"mlflow": {"trackingUri": mlflow.uri, "experiment": "e2e", "credentialsSecret": "tracking"}},
        "learner.template": {"metadata": {"labels": {"team": "rl"}}, "spec": {
            "tolerations": [toleration],
            "containers": [{"name": "learner",
                            "env": [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "tracking",
                                                                                       "key": "api-key"}}}],
                            "envFrom": [{"prefix": "TRACKING_", "secretRef": {"name": "tracking"}}],
                            "volumeMounts": [{"name": "creds", "mountPath": "/etc/tracking", "readOnly": True},
                                             {"name": "scratch", "mountPath": "/scratch"}]}],
            "volumes": [{"name": "creds", "secret": {"secretName": "tracking"}}, {"name": "scratch", "emptyDir": {}}]}},
        "rolloutWorkers.template": {"spec": {
            "tolerations": [toleration],
            "containers": [{"name": "log-tail", "image": TRAINER_IMAGE, "command": ["sleep", "infinity"],
                            "volumeMounts": [{"name": "creds", "mountPath": "/etc/tracking", "readOnly": True}]}],
            "volumes": [{"name": "creds", "secret": {"secretName": "tracking"}}]}},
    })
    job["metadata"]["name"] = "templated"
    apply(bed, secret, job)
    bed.cluster.wait_for("rltj", "templated", namespace=NS, timeout=300,
                         predicate=lambda obj: (obj.get("status") or {}).get("phase") == "Running")

    # The pods as the API has them: the tolerations and the template's label, the operator's labels kept.
    learner_pod = bed.pod(NS, "templated-learner")
    assert own_tolerations(learner_pod) == [toleration]
    assert learner_pod["metadata"]["labels"]["team"] == "rl"
    assert learner_pod["metadata"]["labels"]["kuberl.dev/component"] == "learner"
    worker_pod = bed.pod(NS, "templated-worker-0")
    assert own_tolerations(worker_pod) == [toleration]
    # (the kubelet lists a pod's container statuses by name, not in the spec's order)
    assert sorted(c["name"] for c in worker_pod["status"]["containerStatuses"]) == ["log-tail", "rollout-worker"]
    assert all(c["ready"] for c in worker_pod["status"]["containerStatuses"]), worker_pod["status"]

    # The containers as containerd runs them: the sidecar next to the worker, restricted by default, the
    # Secret mounted read-only in it.
    sidecar = next(n for n in job_containers(bed, "templated") if n.startswith("k8s_log-tail_templated-worker-0_"))
    seen = _running_spec(bed, sidecar)
    assert seen["root"].get("readonly") is True, seen["root"]
    assert (seen["process"]["user"]["uid"], seen["process"]["user"]["gid"]) == (1000, 1000), seen["process"]
    assert seen["process"].get("noNewPrivileges") is True, seen["process"]
    assert not any(seen["process"]["capabilities"].get(kind) for kind in ("bounding", "effective", "permitted")), \
        seen["process"]["capabilities"]
    assert any(m["destination"] == "/etc/tracking" and "ro" in m.get("options", []) for m in seen["mounts"]), \
        seen["mounts"]
    sidecar_key = bed.kubectl("exec", "-n", NS, "templated-worker-0", "-c", "log-tail", "--", "cat",
                              "/etc/tracking/api-key")
    assert sidecar_key.stdout == "s3cr3t"

    # The learner: the Secret's key as an env var, its keys with a prefix (envFrom), the Secret as files,
    # the scratch volume writable; the operator's env (the job, the Ray token) is still there.
    learner = next(n for n in job_containers(bed, "templated") if n.startswith("k8s_learner_templated-learner_"))
    env = dict(e.split("=", 1) for e in _running_spec(bed, learner)["process"]["env"])
    assert env["API_KEY"] == "s3cr3t" and env["TRACKING_api-key"] == "s3cr3t"
    assert env["TRACKING_ENDPOINT"] == "https://tracking.example"
    assert env["KUBERL_JOB_SPEC_FILE"] == "/etc/kuberl/job/job.json"
    assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 64
    # The tracker's token straight from the Secret; the keys the Secret lacks set nothing.
    assert env["MLFLOW_TRACKING_TOKEN"] == "t0ken" and "MLFLOW_TRACKING_USERNAME" not in env
    in_learner = ("exec", "-n", NS, "templated-learner", "-c", "learner", "--")
    handed = json.loads(bed.kubectl(*in_learner, "cat", env["KUBERL_JOB_SPEC_FILE"]).stdout)
    assert handed["metadata"]["name"] == "templated" and "template" in handed["spec"]["learner"]
    shown = bed.kubectl(*in_learner, "sh", "-c",
                        "cat /etc/tracking/api-key && echo && touch /scratch/ok && echo writable")
    assert shown.stdout.split() == ["s3cr3t", "writable"], shown.stdout + shown.stderr

    wait_complete(bed, "templated", 600)
    status = learner_figures(bed, "templated")
    assert status["progress"]["envSteps"] >= 60_000
    assert {c["type"]: c["status"] for c in status["conditions"]}["TrackerReachable"] == "True", status
    # The learner pod's run in MLflow: every iteration at its env steps, ended, its files and policy kept.
    seen = mlflow.query(MLFLOW_RUN, job="templated")
    assert seen["status"] == "FINISHED" and seen["params"]["environment.id"].endswith("LatencyEnv"), seen
    progress = status["progress"]
    assert len(seen["steps"]) == progress["iterations"] and seen["steps"][-1] == progress["envSteps"], seen["steps"]
    assert {"summary.json", "learning_curve.svg", "policy/weights.npz"} <= set(seen["files"]), seen["files"]
    delete_and_check_nothing_left(bed, "templated")


MLFLOW_RUN = """
exp = client.get_experiment_by_name("e2e")
run = client.search_runs([exp.experiment_id], filter_string=f"tags.`kuberl.job` = '{job}'")[0]
files = []
def walk(path=None):
    for f in client.list_artifacts(run.info.run_id, path):
        walk(f.path) if f.is_dir else files.append(f.path)
walk()
out = {"status": run.info.status, "params": run.data.params, "files": sorted(files),
       "steps": [p.step for p in client.get_metric_history(run.info.run_id, "rollout/env_steps")]}
"""


def test_an_owned_field_in_a_template_is_refused_as_invalid_spec_before_any_pod(bed):
    job = example("cartpole-ppo.yaml", **{"learner.template": {"spec": {"containers": [
        {"name": "learner", "command": ["sh", "-c", "echo mine"]}]}}})
    job["metadata"]["name"] = "owned-field"
    apply(bed, job)
    status = bed.cluster.wait_for("rltj", "owned-field", namespace=NS, timeout=120,
                                  predicate=lambda obj: (obj.get("status") or {}).get("phase") == "Failed")["status"]
    assert status["reason"] == "InvalidSpec", status
    assert "spec.learner.template.spec.containers[0].command: is the operator's" in status["message"], status
    assert not bed.cluster.list("pods", NS, label_selector="kuberl.dev/job-name=owned-field")
    delete_and_check_nothing_left(bed, "owned-field")

"""A scan nobody here wrote: checkov's Kubernetes policies over everything KubeRL puts on a cluster.

Two targets, each scanned once: the Helm chart rendered by the real helm for every `ci/*-values.yaml`
(CRDs included), and the manifests the operator builds for every example job (head, learner and
rollout-worker Pods, Services, NetworkPolicies), plus the serving Deployment and Service of a job
with a checkpoint claim. A check we do not follow is skipped by id, with the reason written below,
per target: the scan must report no failure otherwise, and a skipped check must still fire without
its skip (a stale skip is removed, not kept).

checkov has many pinned dependencies, so it lives in a virtualenv of its own outside the clone,
`~/.cache/kuberl/tools/checkov-<version>-venv`, which the first run installs from PyPI; the project's .venv
never sees its packages. A missing checkov skips locally and fails under CI=true (tools.tool_missing).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import job_pods
from pod_security import pod_specs
from tools import REPO, helm_binary, tool_venv, yaml_documents

CHECKOV = "checkov==3.3.30"
CHART = REPO / "charts" / "kuberl-operator"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

#: Checks about how images are named and pulled, which are deploy-time choices for both targets.
IMAGE_SKIPS = {
    "CKV_K8S_43": (
        "Image should use digest. Images are named by tag (the chart's appVersion) because a digest "
        "exists only once an image is pushed to a registry, and an image loaded into a node "
        "(minikube image load, an air-gapped mirror) has none. Where a registry holds it, pin it by "
        "digest at deploy time: spec.image and --trainer-image take `repo@sha256:...`."
    ),
    "CKV_K8S_15": (
        "Image Pull Policy should be Always. The pull policy is a deploy-time value (the chart's "
        "image.pullPolicy and jobDefaults.trainerImage.pullPolicy, the operator's "
        "--image-pull-policy), IfNotPresent by default: Always fails on a node whose image was loaded "
        "without a registry. The all-on CI values set Always, and the schema takes all three policies."
    ),
    "CKV_K8S_40": (
        "Containers should run as a high UID. Both images run as uid 1000, the user their Dockerfiles "
        "create and that owns /home/kuberl. A high uid guards against sharing a uid with a host user "
        "through host mounts; these pods mount no host path (Pod Security restricted), run non-root "
        "with no capability, no privilege escalation and a read-only root filesystem."
    ),
}

CHART_SKIPS = {
    **IMAGE_SKIPS,
    "CKV_K8S_38": (
        "Service Account Tokens only where necessary. The operator is the one pod that calls the API "
        "server (it watches RLTrainingJobs and creates their children), so it mounts its "
        "ServiceAccount's token; every job pod it creates sets automountServiceAccountToken: false "
        "(the job scan below runs this check)."
    ),
    "CKV2_K8S_6": (
        "Pods should have a NetworkPolicy. The operator listens only on its metrics and health ports, "
        "which Prometheus and the kubelet must reach, so an ingress policy would admit all it serves; "
        "its egress (the API server, learners' metrics ports) depends on the cluster's API server "
        "address, which a chart cannot know. The job pods' Ray ports get NetworkPolicies (job scan)."
    ),
}

JOB_SKIPS = {
    **IMAGE_SKIPS,
    "CKV_K8S_8": (
        "Liveness Probe. Job pods run to completion (restartPolicy: Never) and the operator is their "
        "only restarter: `ray start --block` exits when a Ray process of its node dies and the "
        "learner exits on any error, so a dead process already ends its pod. A liveness kill of a "
        "slow but healthy node (a GCS busy under a large job) would fail the pod and spend one of the "
        "job's backoffLimit restarts. The serving Deployment, a long-running server, has liveness."
    ),
    "CKV_K8S_9": (
        "Readiness Probe. A rollout worker serves no Service: it joins the head as a Ray node, and Ray, "
        "not the kubelet, tells the learner when its rollout slot is up; its pod is Ready once its "
        "container runs, past the init container that waits for the head. The head (its GCS port), "
        "the learner (/metrics, when metrics are on) and the serving pods have readiness probes."
    ),
    "CKV_K8S_35": (
        "Secrets as files, not environment variables. Ray needs the job's Ray token in every process "
        "of a node, and those processes (Ray's, and the job's own environment code in the rollout "
        "workers) run as one uid, which could read a mounted token file as well as RAY_AUTH_TOKEN. "
        "The value never appears in the pod spec: it is a secretKeyRef to the job's own Secret."
    ),
    "CKV_K8S_11": (
        "CPU limits. Job pods take spec.*.resources as the job author wrote them: Ray advertises a "
        "pod's CPU limit (else its request) as --num-cpus, and a CFS quota throttles env steps and "
        "the learner's update bursts while protecting neighbours no better than the request does. "
        "Memory limits (CKV_K8S_13) are set by every example and are checked."
    ),
}


# --------------------------------------------------------------------------------------------
# checkov, in its own virtualenv
# --------------------------------------------------------------------------------------------


def checkov_binary() -> Path:
    """checkov in its own virtualenv (tools.tool_venv), installed on first use."""
    return tool_venv("checkov", CHECKOV) / "bin" / "checkov"


def scan(directory: Path, *, only: set[str] | None = None) -> dict:
    """checkov's Kubernetes framework over every YAML file in `directory`; its JSON report."""
    cmd = [str(checkov_binary()), "--framework", "kubernetes", "--directory", str(directory),
           "--output", "json", "--skip-download", "--quiet"]
    if only:
        cmd += ["--check", ",".join(sorted(only))]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    # 0: no failure, 1: failures; anything else is checkov itself failing.
    assert result.returncode in (0, 1), f"checkov exited {result.returncode}: {result.stderr[-2000:]}"
    report = json.loads(result.stdout)
    assert report["check_type"] == "kubernetes", report
    assert report["summary"]["parsing_errors"] == 0, report["results"].get("parsing_errors")
    return report


def failed_checks(report: dict) -> list[dict]:
    return report["results"].get("failed_checks", [])


def failures(report: dict) -> list[str]:
    return [f"{f['check_id']} ({f['check_name']}): {f['resource']} in {Path(f['file_path']).name}"
            for f in failed_checks(report)]


# --------------------------------------------------------------------------------------------
# What is scanned
# --------------------------------------------------------------------------------------------


def resource_count(docs: list[dict]) -> int:
    """How many resources checkov should report for these manifests: each one, and the pod template
    of each workload (a Deployment's template is checked as a Pod of its own)."""
    return len(docs) + sum(1 for doc in docs if doc["kind"] != "Pod" for _ in pod_specs(doc))


def write_chart(directory: Path) -> int:
    """`helm template` the chart with every CI values file; returns checkov's resource count for it."""
    count = 0
    for values in sorted((CHART / "ci").glob("*-values.yaml")):
        result = subprocess.run(
            [str(helm_binary()), "template", "kuberl", str(CHART), "--namespace", "kuberl-system",
             "--include-crds", "--values", str(values)],
            capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        count += resource_count(yaml_documents(result.stdout))
        (directory / values.name).write_text(result.stdout)
    return count


def write_jobs(directory: Path) -> int:
    """Every example job's children as the operator builds them, and one job's serving children;
    returns checkov's resource count for them."""
    from kuberl.api.load import parse_job
    from kuberl.operator import builders

    options = builders.BuildOptions()
    count = 0
    for example in EXAMPLES:
        raw = yaml.safe_load(example.read_text())
        raw["metadata"]["namespace"] = "ml-jobs"
        jobs = [raw]
        if example.name == "cartpole-ppo.yaml":  # a checkpoint claim, and serving from it
            served = copy.deepcopy(raw)
            served["metadata"]["name"] = "cartpole-ppo-served"
            served["spec"]["checkpointing"] = {"volume": {"claimName": "cartpole-checkpoints"}}
            served["spec"]["serving"] = {}
            jobs.append(served)
        for spec in jobs:
            job = parse_job(spec)
            docs = [*job_pods(job, options), *builders.build_services(job, options),
                    *builders.build_serving(job, options), builders.build_ray_token_secret(job, "x" * 64)]
            count += resource_count(docs)
            (directory / f"{job.metadata.name}.yaml").write_text(yaml.safe_dump_all(docs))
    return count


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, tuple[Path, int, dict[str, str]]]:
    """name -> (directory of manifests, how many, the checks skipped there with their reasons)."""
    chart, jobs = tmp_path_factory.mktemp("chart"), tmp_path_factory.mktemp("jobs")
    return {"chart": (chart, write_chart(chart), CHART_SKIPS), "jobs": (jobs, write_jobs(jobs), JOB_SKIPS)}


@pytest.fixture(scope="module")
def reports(targets) -> dict[str, dict]:
    """name -> checkov's report over that target with every check on, each target scanned once: a
    skipped check is left out of what must pass, and must be among what fired (checkov's --skip-check
    only leaves a check unrun, so one full scan answers both)."""
    return {target: scan(directory) for target, (directory, _, _) in targets.items()}


# --------------------------------------------------------------------------------------------
# The scans
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["chart", "jobs"])
def test_checkov_finds_nothing_but_the_checks_skipped_with_a_reason(targets, reports, target):
    _, count, skips = targets[target]
    report = reports[target]
    # Every manifest was read (a file checkov could not parse would pass by being empty).
    assert report["summary"]["resource_count"] == count
    assert report["summary"]["passed"] > 0
    found = [line for f, line in zip(failed_checks(report), failures(report), strict=True) if f["check_id"] not in skips]
    assert not found, f"checkov ({target}): fix these, or skip the check with a reason:\n  " + "\n  ".join(found)


def test_every_skipped_check_has_a_reason_and_still_fires_without_its_skip(targets, reports):
    for skips in (CHART_SKIPS, JOB_SKIPS):
        for check_id, reason in skips.items():
            assert check_id.startswith(("CKV_K8S_", "CKV2_K8S_")), check_id
            assert len(reason.split()) >= 15, f"{check_id}: say why it is skipped, not only that it is"
    for target, (_, _, skips) in targets.items():
        fired = {f["check_id"] for f in failed_checks(reports[target])}
        stale = sorted(set(skips) - fired)
        assert not stale, f"{target}: {stale} no longer fail there: remove them from its skips"


# --------------------------------------------------------------------------------------------
# Hostile templates: what the operator refuses, the scanner flags
# --------------------------------------------------------------------------------------------

#: A tenant's template for the learner -> the checkov check that flags the pod it would give.
HOSTILE_LEARNER_TEMPLATES = {
    "CKV_K8S_16": {"spec": {"containers": [{"name": "side", "image": "busybox:1.36",
                                             "securityContext": {"privileged": True}}]}},
    "CKV_K8S_39": {"spec": {"containers": [{"name": "side", "image": "busybox:1.36",
                                             "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}},
    "CKV_K8S_20": {"spec": {"containers": [{"name": "learner",
                                             "securityContext": {"allowPrivilegeEscalation": True}}]}},
    "CKV_K8S_19": {"spec": {"hostNetwork": True}},
    "CKV_K8S_17": {"spec": {"hostPID": True}},
    "CKV_K8S_18": {"spec": {"hostIPC": True}},
    "CKV_K8S_26": {"spec": {"containers": [{"name": "side", "image": "busybox:1.36",
                                             "ports": [{"containerPort": 80, "hostPort": 80}]}]}},
    "CKV_K8S_38": {"spec": {"automountServiceAccountToken": True}},
    "CKV_K8S_27": {"spec": {"volumes": [{"name": "sock", "hostPath": {"path": "/var/run/docker.sock"}}]}},
}


def test_every_hostile_template_the_scanner_flags_is_refused_by_the_operator(job_dict, tmp_path):
    """The operator's own check (tenancy, default allowance) against checkov on the pods such templates
    would build if nothing refused them: each is flagged by the named check, and each is refused."""
    from kuberl.api.load import parse_job
    from kuberl.api.problems import InvalidJob
    from kuberl.api.tenancy import Tenancy
    from kuberl.operator import builders

    for check_id, template in HOSTILE_LEARNER_TEMPLATES.items():
        spec = copy.deepcopy(job_dict)
        spec["metadata"] = {"name": f"hostile-{check_id.lower().replace('_', '-')}", "namespace": "ml-jobs"}
        spec["spec"]["learner"] = {"template": template}
        with pytest.raises(InvalidJob):
            parse_job(copy.deepcopy(spec), tenancy=Tenancy())
        pod = builders.build_learner_pod(parse_job(spec), builders.BuildOptions())  # as if unchecked
        (tmp_path / f"{check_id}.yaml").write_text(yaml.safe_dump(pod))
    report = scan(tmp_path, only=set(HOSTILE_LEARNER_TEMPLATES))
    flagged = {(Path(f["file_path"]).stem, f["check_id"]) for f in failed_checks(report)}
    missed = [check_id for check_id in HOSTILE_LEARNER_TEMPLATES if (check_id, check_id) not in flagged]
    assert not missed, f"checkov did not flag the pods these templates give: {missed}"

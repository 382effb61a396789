"""Pod templates per role (spec.<role>.template): the schema from Kubernetes' own PodTemplateSpec, the
refusal of typos and of the operator's fields (with the field's path), and the merge onto built pods."""

from __future__ import annotations

import copy
import json

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import REPO, job_pods
from kuberl.api import crd, pod_schema, pod_template
from kuberl.api.load import parse_job
from kuberl.api.problems import InvalidJob
from kuberl.operator import builders, kueue
from kuberl.operator.builders import BuildOptions
from pod_security import assert_restricted

OPTIONS = BuildOptions(trainer_image="registry.local/kuberl-trainer:test")
GPU_EXAMPLE = REPO / "examples" / "cartpole-ppo-gpu-pool.yaml"

TEMPLATE = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"cost-center": "42"}},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "gpu"},
        "priorityClassName": "high",
        "serviceAccountName": "trainer",
        "automountServiceAccountToken": True,
        "imagePullSecrets": [{"name": "regcred"}],
        "securityContext": {"runAsUser": 2000, "supplementalGroups": [5]},
        "containers": [
            {"name": "learner",
             "env": [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "tracking", "key": "api-key"}}}],
             "envFrom": [{"secretRef": {"name": "more-env"}}],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
             "securityContext": {"readOnlyRootFilesystem": False}},
            {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "inf"],
             "securityContext": {"runAsUser": 3000}},
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    },
}


def job_with(job_dict: dict, role: str, template: dict):
    job_dict["spec"].setdefault(role, {})["template"] = template
    return parse_job(job_dict)


def problems_of(job_dict: dict, role: str, template: dict) -> list[tuple[str, str]]:
    with pytest.raises(InvalidJob) as err:
        job_with(job_dict, role, template)
    return [(p.path, p.message) for p in err.value.problems]


def container(pod: dict, name: str) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


# ---- the schema: Kubernetes' own, generated, in the CRD for every role -----------------------------------


def test_committed_schema_is_generated_from_kubernetes_pod_template_spec():
    assert pod_schema.schema() == pod_schema.generate(), \
        "operator/kuberl/api/pod_template_schema.json is stale: run `python -m kuberl.api.pod_schema`"
    spec = pod_schema.schema()["properties"]["spec"]["properties"]
    for field in ("tolerations", "affinity", "topologySpreadConstraints", "priorityClassName", "schedulerName",
                  "serviceAccountName", "imagePullSecrets", "volumes", "containers", "nodeSelector"):
        assert spec[field]["description"], field  # kubectl explain shows it
    assert set(pod_schema.schema()["properties"]["metadata"]["properties"]) == {"labels", "annotations"}


def test_every_role_carries_the_template_schema_in_the_crd_and_it_fits_client_side_apply():
    doc = crd.crd()
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for role in pod_template.MAIN_CONTAINERS:
        template = spec[role]["properties"]["template"]
        assert template["properties"] == pod_schema.schema()["properties"], role
        assert pod_template.MAIN_CONTAINERS[role] in template["description"]
    # kubectl apply (client-side) keeps the whole object in an annotation of at most 256 KiB.
    size = len(json.dumps(doc, separators=(",", ":")))
    assert size < 256 * 1024, f"the CRD is {size} bytes: over what kubectl's client-side apply can annotate"


def _closed(node):
    """The CRD's schema with unknown fields refused, as the API server's strict field validation does."""
    if isinstance(node, dict):
        out = {k: _closed(v) for k, v in node.items() if k != "x-kubernetes-int-or-string"}
        if "properties" in node:
            out["additionalProperties"] = False
        return out
    return [_closed(v) for v in node] if isinstance(node, list) else node


def test_the_crd_refuses_a_typo_in_a_template_and_agrees_with_kubernetes_own_strict_schema():
    doc = crd.crd()
    template_schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["learner"]["properties"]["template"]
    crd_check = jsonschema.Draft7Validator(_closed(template_schema))
    good = copy.deepcopy(TEMPLATE)
    typo = {"spec": {"tolerations": [{"key": "gpu", "efect": "NoSchedule"}]}}
    bad_type = {"spec": {"containers": [{"name": "x", "image": "y", "ports": [{"containerPort": "80"}]}]}}
    assert not list(crd_check.iter_errors(good))
    assert [list(e.absolute_path) for e in crd_check.iter_errors(typo)] == [["spec", "tolerations", 0]]
    assert list(crd_check.iter_errors(bad_type))
    # Kubernetes' own strict PodTemplateSpec (kubernetes-validate) judges the same three the same way.
    for template, valid in ((good, True), (typo, False), (bad_type, False)):
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
        try:
            kubernetes_validate.validate(pod, "1.27", strict=True)
            assert valid, template
        except kubernetes_validate.ValidationError:
            assert not valid, template
        assert (pod_schema.problems(template) == []) == valid, template


# ---- refusals: typos and the operator's fields, each naming its field -------------------------------------


@pytest.mark.parametrize("template, path, message", [
    ({"spec": {"tolerations": [{"key": "gpu", "efect": "NoSchedule"}]}},
     "spec.learner.template.spec.tolerations[0].efect", "unknown field"),
    ({"spec": {"priority": "high"}}, "spec.learner.template.spec.priority", "must be an integer, got a string"),
    ({"metadata": {"name": "mine"}}, "spec.learner.template.metadata.name", "unknown field"),
    ({"spec": {"containers": [{"image": "x"}]}}, "spec.learner.template.spec.containers[0].name",
     "required field is missing"),
])
def test_typos_and_wrong_types_are_refused_with_the_field(job_dict, template, path, message):
    assert (path, message) in problems_of(job_dict, "learner", template)


@pytest.mark.parametrize("role, template, path, says", [
    ("learner", {"spec": {"containers": [{"name": "learner", "command": ["python", "evil.py"]}]}},
     "spec.learner.template.spec.containers[0].command", "is the operator's"),
    ("head", {"spec": {"containers": [{"name": "ray-head", "ports": [{"containerPort": 6379}]}]}},
     "spec.head.template.spec.containers[0].ports", "is the operator's"),
    ("rolloutWorkers", {"spec": {"containers": [{"name": "rollout-worker", "args": ["x"]}]}},
     "spec.rolloutWorkers.template.spec.containers[0].args", "is the operator's"),
    ("learner", {"spec": {"containers": [{"name": "learner", "image": "mine:1"}]}},
     "spec.learner.template.spec.containers[0].image", "set spec.image"),
    ("learner", {"spec": {"containers": [{"name": "learner", "resources": {"limits": {"cpu": "1"}}}]}},
     "spec.learner.template.spec.containers[0].resources", "set spec.learner.resources"),
    ("learner", {"spec": {"containers": [{"name": "learner", "env": [{"name": "RAY_AUTH_TOKEN", "value": "x"}]}]}},
     "spec.learner.template.spec.containers[0].env[0].name", "set by the operator"),
    ("learner", {"spec": {"containers": [{"name": "learner", "env": [{"name": "KUBERL_JOB_SPEC", "value": "{}"}]}]}},
     "spec.learner.template.spec.containers[0].env[0].name", "set by the operator"),
    ("learner", {"spec": {"containers": [{"name": "learner", "volumeMounts": [{"name": "v", "mountPath": "/tmp"}]}]}},
     "spec.learner.template.spec.containers[0].volumeMounts[0].mountPath", "mounted by the operator"),
    ("learner", {"spec": {"volumes": [{"name": "checkpoints", "emptyDir": {}}]}},
     "spec.learner.template.spec.volumes[0].name", "a volume of the operator's"),
    ("learner", {"spec": {"restartPolicy": "Always"}}, "spec.learner.template.spec.restartPolicy",
     "restarts the job's pods itself"),
    ("learner", {"spec": {"initContainers": [{"name": "learner", "image": "x"}]}},
     "spec.learner.template.spec.initContainers[0].name", "a container of the operator's"),
    ("serving", {"metadata": {"labels": {"kuberl.dev/job-name": "other"}}},
     "spec.serving.template.metadata.labels.kuberl.dev/job-name", "is the operator's"),
    ("learner", {"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}},
     "spec.learner.template.metadata.labels.app.kubernetes.io/instance", "is the operator's"),
    ("learner", {"metadata": {"annotations": {"prometheus.io/port": "1"}}},
     "spec.learner.template.metadata.annotations.prometheus.io/port", "is the operator's"),
    ("learner", {"metadata": {"annotations": {"kuberl.dev/learner-replicas": "1"}}},
     "spec.learner.template.metadata.annotations.kuberl.dev/learner-replicas", "records how it runs the pod"),
    ("rolloutWorkers", {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "other"}}},
     "spec.rolloutWorkers.template.metadata.labels.kueue.x-k8s.io/queue-name", "spec.queueName"),
    ("head", {"spec": {"schedulingGates": [{"name": "mine"}]}},
     "spec.head.template.spec.schedulingGates", "Kueue pod group"),
    ("learner", {"spec": {"volumes": [{"name": "preferences", "emptyDir": {}}]}},
     "spec.learner.template.spec.volumes[0].name", "a volume of the operator's"),
    ("learner", {"spec": {"containers": [{"name": "sidecar"}]}},
     "spec.learner.template.spec.containers[0].image", "a sidecar needs its own image"),
])
def test_an_override_of_an_owned_field_is_refused_naming_it(job_dict, role, template, path, says):
    if role == "serving":
        job_dict["spec"]["checkpointing"]["volume"] = {"claimName": "ckpt"}
    found = problems_of(job_dict, role, template)
    assert any(p == path and says in m for p, m in found), found


#: Spellings of a mount that lands on, inside or above a path the operator mounts, and which one it hits.
SHADOWING_MOUNTS = [
    ("/tmp", "is /tmp"), ("/tmp/", "is /tmp"), ("//tmp", "is /tmp"), ("///tmp//", "is /tmp"), ("/tmp/.", "is /tmp"),
    ("tmp", "is /tmp"), ("/etc/kuberl/job/", "is /etc/kuberl/job"), ("/etc/kuberl/./job", "is /etc/kuberl/job"),
    ("/etc/../etc/kuberl/job", "is /etc/kuberl/job"), ("//dev/shm/", "is /dev/shm"),
    ("/etc/kuberl/job/x", "is inside /etc/kuberl/job"), ("/checkpoints/run-1", "is inside /checkpoints"),
    ("/etc/kuberl", "is above /etc/kuberl/preferences and would hide it"),
    ("/etc/kuberl/", "is above /etc/kuberl/preferences and would hide it"),
    ("/dev", "is above /dev/shm and would hide it"), ("/", "is above /tmp and would hide it"),
    ("//", "is above /tmp and would hide it"),
]


@pytest.mark.parametrize("mount_path, says", SHADOWING_MOUNTS, ids=[m[0] for m in SHADOWING_MOUNTS])
def test_a_mount_is_compared_where_it_lands_not_as_it_is_spelled(job_dict, mount_path, says):
    template = {"spec": {"containers": [{"name": "learner", "volumeMounts": [{"name": "v", "mountPath": mount_path}],
                                         "volumeDevices": [{"name": "d", "devicePath": mount_path}]}],
                         "volumes": [{"name": "v", "emptyDir": {}},
                                     {"name": "d", "persistentVolumeClaim": {"claimName": "raw"}}]}}
    found = dict(problems_of(job_dict, "learner", template))
    for field in ("volumeMounts[0].mountPath", "volumeDevices[0].devicePath"):
        message = found.pop(f"spec.learner.template.spec.containers[0].{field}")
        assert message.startswith(f"{mount_path!r} {says}, mounted by the operator"), message
        assert "neither at, inside nor above any of /tmp, /dev/shm, /checkpoints" in message
    assert not found


@pytest.mark.parametrize("mount_path", ["/tmpdata", "/tmp-2", "/data/tmp", "/etc/kuberl-extra", "/etc/kuberl/jobs",
                                        "/devices", "/checkpoints2", "/opt/etc/kuberl/job"])
def test_a_mount_beside_an_owned_path_is_the_tenants(job_dict, mount_path):
    job_with(job_dict, "learner", {"spec": {
        "containers": [{"name": "learner", "volumeMounts": [{"name": "v", "mountPath": mount_path}]},
                       # A sidecar's filesystem is its own: the operator mounts nothing there.
                       {"name": "side", "image": "busybox:1.36", "volumeMounts": [{"name": "v", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "v", "emptyDir": {}}]}})


def test_kuberl_validate_reports_a_template_problem_with_its_line(tmp_path):
    import subprocess
    import sys

    text = GPU_EXAMPLE.read_text().replace("operator: Exists, effect:", "operator: Exists, efect:")
    (tmp_path / "job.yaml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "kuberl.trainer.cli", "validate", str(tmp_path / "job.yaml")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "efect" in t)
    assert f"spec.learner.template.spec.tolerations[0].efect (line {line}): unknown field" in proc.stderr


# ---- the merge ----------------------------------------------------------------------------------------


def test_a_template_merges_onto_the_learner_pod_and_keeps_what_the_operator_owns(job_dict):
    plain = builders.build_learner_pod(parse_job(copy.deepcopy(job_dict)), OPTIONS)
    job_dict["spec"]["learner"] = {"nodeSelector": {"zone": "a"}}
    pod = builders.build_learner_pod(job_with(job_dict, "learner", copy.deepcopy(TEMPLATE)), OPTIONS)
    spec, learner = pod["spec"], container(pod, "learner")
    assert pod["metadata"]["labels"] == {**plain["metadata"]["labels"], "team": "rl"}
    assert pod["metadata"]["annotations"] == {**plain["metadata"]["annotations"], "cost-center": "42"}
    assert spec["tolerations"] == TEMPLATE["spec"]["tolerations"]
    assert spec["nodeSelector"] == {"zone": "a", "pool": "gpu"}  # spec.learner.nodeSelector, then the template's
    assert (spec["priorityClassName"], spec["serviceAccountName"]) == ("high", "trainer")
    assert spec["automountServiceAccountToken"] is True and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["securityContext"] == {**plain["spec"]["securityContext"], "runAsUser": 2000, "supplementalGroups": [5]}
    assert spec["restartPolicy"] == "Never"
    # (the job's ConfigMap is named by the job's content, template included: compare the volume names)
    assert [v["name"] for v in spec["volumes"]] == [*(v["name"] for v in plain["spec"]["volumes"]), "scratch"]
    assert spec["volumes"][-1] == {"name": "scratch", "emptyDir": {}}
    # The operator's container: its own command, env and mounts first, the template's added by name/path.
    built = container(plain, "learner")
    assert learner["command"] == built["command"] and learner["ports"] == built["ports"]
    assert [e["name"] for e in learner["env"]] == [*(e["name"] for e in built["env"]), "API_KEY"]
    assert learner["env"][1:] == [*built["env"][1:], TEMPLATE["spec"]["containers"][0]["env"][0]]
    assert learner["envFrom"] == [{"secretRef": {"name": "more-env"}}]
    assert learner["volumeMounts"] == [*built["volumeMounts"], {"name": "scratch", "mountPath": "/scratch"}]
    assert learner["securityContext"] == {**built["securityContext"], "readOnlyRootFilesystem": False}
    # The sidecar is appended, starting from the restricted defaults of the operator's container.
    assert [c["name"] for c in spec["containers"]] == ["learner", "sidecar"]
    assert container(pod, "sidecar")["securityContext"] == {**built["securityContext"], "runAsUser": 3000}
    assert "initContainers" not in spec and "initContainers" not in plain["spec"]


def test_env_and_lists_merge_by_key_and_the_template_wins_for_its_own_items():
    pod = {"metadata": {}, "spec": {"containers": [
        {"name": "learner", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
         "args": ["x"]}], "tolerations": [{"key": "a"}]}}
    template = {"spec": {"containers": [{"name": "learner", "env": [{"name": "B", "value": "3"},
                                                                      {"name": "C", "value": "4"}]}],
                         "tolerations": [{"key": "b"}]}}
    merged = pod_template.merge(pod, template, "learner")
    assert merged["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"},
                                                      {"name": "C", "value": "4"}]
    assert merged["spec"]["tolerations"] == [{"key": "a"}, {"key": "b"}]  # appended
    assert pod["spec"]["containers"][0]["env"][1] == {"name": "B", "value": "2"}  # the input is left alone


def test_every_role_takes_its_template_and_the_pods_stay_pod_security_restricted(job_dict):
    job_dict["spec"]["checkpointing"]["volume"] = {"claimName": "ckpt"}
    for role, name in pod_template.MAIN_CONTAINERS.items():
        job_dict["spec"].setdefault(role, {})["template"] = {"spec": {
            "tolerations": [{"key": role, "operator": "Exists"}],
            "containers": [{"name": name, "env": [{"name": "ROLE", "value": role}]},
                           {"name": "side", "image": "busybox:1.36"}]}}
    job = parse_job(job_dict)
    deployment = builders.build_serving_deployment(job, OPTIONS)
    pods = {"head": builders.build_head_pod(job, OPTIONS), "rolloutWorkers": builders.build_worker_pod(job, OPTIONS, 0),
            "learner": builders.build_learner_pod(job, OPTIONS),
            "serving": {"metadata": {}, "spec": deployment["spec"]["template"]["spec"]}}
    for role, pod in pods.items():
        assert pod["spec"]["tolerations"] == [{"key": role, "operator": "Exists"}], role
        assert {"name": "ROLE", "value": role} in container(pod, pod_template.MAIN_CONTAINERS[role])["env"]
        assert [c["name"] for c in pod["spec"]["containers"]][-1] == "side"
    for manifest in (*job_pods(job, OPTIONS), deployment):
        assert_restricted(manifest)


def test_the_owned_lists_cover_everything_the_builders_set(job_dict):
    """The owned-field rules live in kuberl.api (no operator import): check they name all the builders set."""
    job_dict["spec"]["checkpointing"]["volume"] = {"claimName": "ckpt"}
    job_dict["spec"]["serving"] = {}
    job_dict["spec"]["queueName"] = "team-a"
    job_dict["spec"]["algorithm"] = {"name": "BDQ", "bdq": {"preference": {"configMap": "pairs"}}}
    job = parse_job(job_dict)
    replicas = parse_job({**job_dict, "spec": {**job_dict["spec"], "algorithm": {"name": "DQN"},
                                               "learner": {"replicas": 2}}})
    deployment = builders.build_serving_deployment(job, OPTIONS)
    serving = {"metadata": deployment["spec"]["template"]["metadata"], "spec": deployment["spec"]["template"]["spec"]}
    pods = [kueue.enroll(pod, job, 0) for pod in job_pods(job, OPTIONS)]
    pods.append(kueue.enroll(builders.build_learner_replica_pod(replicas, OPTIONS, 1), replicas, 0))
    for pod in (*pods, serving):
        for key in pod["metadata"].get("labels", {}):
            assert (key.startswith((pod_template.OWNED_LABEL_PREFIX, pod_template.KUEUE_PREFIX))
                    or key in pod_template.OWNED_LABELS), key
        for key in pod["metadata"].get("annotations", {}):
            assert (key in pod_template.OWNED_ANNOTATIONS
                    or key.startswith((pod_template.OWNED_LABEL_PREFIX, pod_template.KUEUE_PREFIX))), key
        if "schedulingGates" in pod["spec"]:
            assert pod["metadata"]["labels"][f"{pod_template.KUEUE_PREFIX}queue-name"] == "team-a"
        assert {v["name"] for v in pod["spec"]["volumes"]} <= set(pod_template.OWNED_VOLUMES)
        assert "initContainers" not in pod["spec"]  # a node waits for its head in its own process
        for c in pod["spec"]["containers"]:
            assert c["name"] in pod_template.MAIN_CONTAINERS.values()
            assert {m["mountPath"] for m in c.get("volumeMounts", [])} <= set(pod_template.OWNED_MOUNT_PATHS)
            for env in c.get("env", []):
                assert (env["name"] in pod_template.OWNED_ENV or env["name"].startswith("KUBERL_")
                        or env["name"] in pod_template.DEFAULTED_ENV), env["name"]


def test_the_gpu_pool_example_builds_pods_that_tolerate_the_pool_and_ask_for_a_gpu():
    job = parse_job(yaml.safe_load(GPU_EXAMPLE.read_text()))
    learner = builders.build_learner_pod(job, OPTIONS)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in learner["spec"]["tolerations"]
    assert container(learner, "learner")["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert learner["spec"]["nodeSelector"] == {"cloud.example.com/pool": "gpu"}
    assert learner["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    worker = builders.build_worker_pod(job, OPTIONS, 0)
    assert [c["name"] for c in worker["spec"]["containers"]] == ["rollout-worker", "simulator"]
    for manifest in job_pods(job, OPTIONS):
        assert_restricted(manifest)

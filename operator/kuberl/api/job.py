"""The RLTrainingJob model: the single source of truth for spec, status, CRD schema and validation.

Imports pydantic only (no torch, no ray, no gymnasium): the operator, the CLI and the learner all
parse a job with these classes, and `kuberl crd` generates the CRD's openAPIV3Schema from them.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kuberl.api import kube, pod_schema, pod_template
from kuberl.api.rules import Rule, broken, on_field, schema_entries

GROUP = "kuberl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLTrainingJob"
PLURAL = "rltrainingjobs"
SINGULAR = "rltrainingjob"
SHORT_NAMES = ["rltj"]


def _rules_in_schema(schema: dict[str, Any], cls: type) -> None:
    rules = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = schema_entries(rules)


class _Model(BaseModel):
    """Base: camelCase in YAML, snake_case in Python, unknown fields rejected (they are typos), every
    float finite: YAML's .inf and .nan are no JSON (the API server and the learner pod get a job as JSON),
    and `maxWallClockSeconds: .inf` would be a job that never stops. A class's cross-field `RULES`
    (kuberl.api.rules) go into its schema as CEL and are checked once its fields are parsed."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_enum_values=False,
        allow_inf_nan=False,
        json_schema_extra=_rules_in_schema,
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Any:
        problems = broken(self, type(self).RULES)
        if problems:
            raise ValueError("; ".join(problems))
        return self


# --------------------------------------------------------------------------------------------
# Values that end up in pod manifests: checked as the API server would, schema patterns in the CRD
# --------------------------------------------------------------------------------------------

Quantity = Annotated[str, AfterValidator(kube.check_quantity), Field(json_schema_extra={
    "pattern": kube.QUANTITY_PATTERN, "maxLength": kube.QUANTITY_MAX_LENGTH})]
ResourceName = Annotated[str, AfterValidator(kube.check_resource_name)]
LabelKey = Annotated[str, AfterValidator(kube.check_label_key)]
LabelValue = Annotated[str, AfterValidator(kube.check_label_value), Field(json_schema_extra={
    "pattern": kube.LABEL_VALUE_PATTERN, "maxLength": 63})]
DnsSubdomain = Annotated[str, AfterValidator(kube.check_dns_subdomain), Field(json_schema_extra={
    "pattern": kube.DNS_SUBDOMAIN_PATTERN, "maxLength": 253})]
ImageReference = Annotated[str, AfterValidator(kube.check_image), Field(json_schema_extra={
    "pattern": kube.IMAGE_PATTERN})]


def _json_values(value: dict[str, Any]) -> dict[str, Any]:
    problem = kube.json_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: Free-form mappings (env kwargs, baseline params): they travel as JSON (API server, learner pod).
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_values)]


def _template_check(role: str) -> AfterValidator:
    """spec.<role>.template: Kubernetes' PodTemplateSpec (its schema in the CRD), checked and merged by
    kuberl.api.pod_template."""
    return AfterValidator(lambda v: v if v is None else pod_template.check(v, role))


_TEMPLATE_SCHEMA = WithJsonSchema(pod_schema.schema())


def _template_field(role: str) -> Any:
    return Field(default=None, description=(
        f"Pod template merged onto the {pod_template.MAIN_CONTAINERS[role]} pods the operator builds (labels, "
        "annotations, pod spec): tolerations, affinity, env, volumes, sidecars; lists merge by name. The "
        f"container named {pod_template.MAIN_CONTAINERS[role]!r} is the operator's: its command, image, ports, "
        "resources, probes, KUBERL_*/Ray env and mounts cannot be set, nor restartPolicy or kuberl.dev/* labels "
        "(docs/pod-templates.md). " + pod_template.BOUNDS_TEXT + " Cluster only."))

# CEL rules (`x-kubernetes-validations`): the cross-field checks below, in the CRD, so a real API server
# refuses a bad job at `kubectl apply`. Only base CEL and regexes: the chart supports Kubernetes 1.27,
# whose CRD rules lack the quantity library (so requests <= limits is checked by the operator only) and
# `fieldPath` (so each message names its field).
_STANDARD_RESOURCE_CEL = "k in ['cpu', 'memory', 'ephemeral-storage']"
_RESOURCE_NAME_CEL = (
    f"{_STANDARD_RESOURCE_CEL} || k.matches(r'^hugepages-{kube.QUANTITY_PATTERN[1:]}') || "
    f"(k.contains('/') && !k.contains('kubernetes.io/') && k.matches(r'{kube.QUALIFIED_NAME_PATTERN}'))"
)
_HUGEPAGES_CEL = "exists(k, k.startsWith('hugepages-'))"
def _names_valid(names: Any) -> bool:
    try:
        for name in names:
            kube.check_resource_name(name)
    except ValueError:
        return False
    return True


_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
RESOURCES_RULES = (
    Rule(f"!has(self.requests) || self.requests.all(k, {_RESOURCE_NAME_CEL})",
         f"requests: resource names must be {kube.RESOURCE_NAMES_ALLOWED}",
         lambda r: _names_valid(r.requests)),
    Rule(f"!has(self.limits) || self.limits.all(k, {_RESOURCE_NAME_CEL})",
         f"limits: resource names must be {kube.RESOURCE_NAMES_ALLOWED}",
         lambda r: _names_valid(r.limits)),
    Rule(f"!has(self.requests) || self.requests.all(k, {_STANDARD_RESOURCE_CEL} || "
         "(has(self.limits) && k in self.limits))",
         "requests: an extended resource (e.g. nvidia.com/gpu) or hugepages request needs a limit of the same "
         "value: they cannot be overcommitted",
         lambda r: all(name in _STANDARD_RESOURCES or name in r.limits for name in r.requests),
         lambda r: "; ".join(f"requests.{n} {v!r} needs limits.{n}" for n, v in r.requests.items()
                             if n not in _STANDARD_RESOURCES and n not in r.limits)),
    Rule(f"!((has(self.requests) && self.requests.{_HUGEPAGES_CEL}) || "
         f"(has(self.limits) && self.limits.{_HUGEPAGES_CEL})) || "
         "(has(self.requests) && ('cpu' in self.requests || 'memory' in self.requests)) || "
         "(has(self.limits) && ('cpu' in self.limits || 'memory' in self.limits))",
         "hugepages need a cpu or memory request or limit too",
         lambda r: not any(n.startswith(kube.HUGEPAGES_PREFIX) for n in (*r.requests, *r.limits))
         or bool({*r.requests, *r.limits} & {"cpu", "memory"})),
)
NODE_SELECTOR_RULES: list[Any] = [
    {"rule": f"self.all(k, k.matches(r'{kube.QUALIFIED_NAME_PATTERN}'))",
     "message": "node selector keys must be label keys: an optional DNS-subdomain prefix and '/', then at most "
                "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"},
]
NODE_SELECTOR_MAX = 64
RESOURCES_MAX = 16


# --------------------------------------------------------------------------------------------
# Algorithms and their hyperparameters
# --------------------------------------------------------------------------------------------


class AlgorithmName(str, enum.Enum):
    PPO = "PPO"
    DQN = "DQN"
    BDQ = "BDQ"
    QLEARNING = "QLearning"
    SAC = "SAC"
    TD3 = "TD3"


#: What each algorithm can act in. The semantic check compares this with the env's action space.
ACTION_SPACES_SUPPORTED: dict[AlgorithmName, tuple[str, ...]] = {
    AlgorithmName.PPO: ("Discrete", "Box", "MultiDiscrete"),
    AlgorithmName.DQN: ("Discrete",),
    AlgorithmName.BDQ: ("MultiDiscrete", "Discrete"),
    AlgorithmName.QLEARNING: ("Discrete",),
    AlgorithmName.SAC: ("Box",),
    AlgorithmName.TD3: ("Box",),
}


def algorithms_acting_in(action_kind: str) -> list[str]:
    """The algorithms that can act in an action space of this kind, in the table's order."""
    return [name.value for name, kinds in ACTION_SPACES_SUPPORTED.items() if action_kind in kinds]


class NetworkSpec(_Model):
    hidden_sizes: list[int] = Field(
        default=[64, 64],
        min_length=1,
        max_length=8,
        description="Widths of the hidden layers of the MLP torso, first to last.",
    )
    activation: Literal["tanh", "relu"] = Field(default="tanh", description="Hidden-layer activation.")

    @field_validator("hidden_sizes")
    @classmethod
    def _positive_widths(cls, v: list[int]) -> list[int]:
        for width in v:
            if not 1 <= width <= 4096:
                raise ValueError(f"every hidden size must be between 1 and 4096, got {width}")
        return v


class ReluNetworkSpec(NetworkSpec):
    """An MLP whose hidden layers default to ReLU: a job that gives only hiddenSizes keeps the algorithm's
    activation rather than PPO's tanh."""

    activation: Literal["tanh", "relu"] = Field(default="relu", description="Hidden-layer activation.")


class QNetworkSpec(ReluNetworkSpec):
    hidden_sizes: list[int] = Field(default=[128, 128], min_length=1, max_length=8,
                                    description="Widths of the hidden layers of the MLP torso, first to last.")


class ActorCriticNetworkSpec(ReluNetworkSpec):
    hidden_sizes: list[int] = Field(default=[256, 256], min_length=1, max_length=8,
                                    description="Widths of the hidden layers of the MLP torso, first to last.")


class PPOConfig(_Model):
    """Proximal Policy Optimization (clipped objective, GAE). Defaults solve CartPole-v1."""

    learning_rate: float = Field(default=2.5e-3, gt=0, le=1, description="Adam learning rate.")
    anneal_learning_rate: bool = Field(
        default=True, description="Linearly anneal the learning rate to 0 over the env-step budget."
    )
    rollout_steps: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Env steps each environment copy collects per iteration (batch = this x all envs).",
    )
    gamma: float = Field(default=0.99, gt=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(default=0.95, ge=0, le=1, description="GAE lambda.")
    clip_coef: float = Field(default=0.2, gt=0, le=1, description="PPO ratio clip epsilon.")
    clip_value_loss: bool = Field(default=False, description="Clip the value loss like the policy ratio.")
    value_coef: float = Field(default=0.5, ge=0, description="Weight of the value loss.")
    entropy_coef: float = Field(default=0.0, ge=0, description="Weight of the entropy bonus.")
    epochs: int = Field(default=4, ge=1, le=100, description="Optimisation epochs per batch.")
    minibatches: int = Field(default=4, ge=1, le=4096, description="Minibatches per epoch.")
    normalize_advantages: bool = Field(default=True, description="Normalise advantages per minibatch.")
    max_grad_norm: float = Field(default=0.5, gt=0, description="Global gradient-norm clip.")
    target_kl: float | None = Field(
        default=None, gt=0, description="Stop an update's epochs early when approx KL exceeds this."
    )
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Actor and critic MLP shape.")


# The replay settings DQN, BDQ, SAC and TD3 share: one bound and one description each, their own defaults.
def _gamma(default: float) -> Any:
    return Field(default=default, gt=0, le=1, description="Discount factor.")


def _buffer_size(default: int) -> Any:
    return Field(default=default, ge=64, le=50_000_000, description="Replay buffer capacity in transitions.")


def _batch_size(default: int) -> Any:
    return Field(default=default, ge=1, le=65_536, description="Transitions per gradient update.")


def _train_frequency(default: int) -> Any:
    return Field(default=default, ge=1, description="Env steps (summed over all envs) per gradient update.")


def _gradient_steps(default: int) -> Any:
    return Field(default=default, ge=1, le=1000, description="Gradient updates per train call.")


class DQNConfig(_Model):
    """Deep Q-learning: double DQN, dueling head, target network, n-step returns. Defaults solve CartPole-v1."""

    learning_rate: float = Field(default=5e-4, gt=0, le=1, description="Adam learning rate.")
    gamma: float = _gamma(0.99)
    buffer_size: int = _buffer_size(100_000)
    batch_size: int = _batch_size(128)
    learning_starts: int = Field(
        default=1_000, ge=0, description="Env steps collected before the first gradient update."
    )
    train_frequency: int = _train_frequency(4)
    gradient_steps: int = _gradient_steps(1)
    double_q: bool = Field(default=True, description="Double DQN: online net picks, target net evaluates.")
    dueling: bool = Field(default=True, description="Dueling head: V(s) + A(s,a) - mean_a A(s,a).")
    n_step: int = Field(default=3, ge=1, le=100, description="n-step return length.")
    target_update: Literal["hard", "polyak"] = Field(
        default="polyak", description="Copy the online net every targetUpdateInterval updates, or blend by tau."
    )
    target_update_interval: int = Field(
        default=500, ge=1, description="Gradient updates between hard target copies."
    )
    tau: float = Field(default=0.005, gt=0, le=1, description="Polyak coefficient for soft target updates.")
    exploration_initial: float = Field(default=1.0, ge=0, le=1, description="Initial epsilon.")
    exploration_final: float = Field(default=0.02, ge=0, le=1, description="Final epsilon.")
    exploration_fraction: float = Field(
        default=0.1, gt=0, le=1, description="Fraction of the env-step budget over which epsilon decays."
    )
    exploration_steps: int | None = Field(
        default=None,
        ge=1,
        description="Env steps over which epsilon decays; overrides explorationFraction when set.",
    )
    max_grad_norm: float = Field(default=10.0, gt=0, description="Global gradient-norm clip.")
    loss: Literal["huber", "mse"] = Field(default="huber", description="TD loss.")
    network: QNetworkSpec = Field(default_factory=QNetworkSpec, description="Q-network MLP shape.")


class BDQConfig(DQNConfig):
    """Branching Dueling Q-Network: one advantage branch per action dimension over a shared trunk."""

    branch_hidden_size: int = Field(
        default=64, ge=1, le=4096, description="Hidden width of each advantage branch and the value head."
    )
    target_aggregation: Literal["mean", "max", "independent"] = Field(
        default="mean",
        description="How branch targets are formed: the mean over branches of the target Q (BDQ paper "
        "default), the max, or each branch on its own.",
    )
    preference: PreferenceSpec | None = Field(
        default=None,
        description="Preference-alignment head on the shared trunk, trained from ranked segment pairs "
        "(README: Preference alignment). Unset: no head.",
    )


class ContinuousReplayConfig(_Model):
    """What SAC and TD3 share: a replay buffer, twin Q-networks on (observation, action), Polyak target
    updates. Defaults are CleanRL's (cleanrl/sac_continuous_action.py lines 45-52 and
    cleanrl/td3_continuous_action.py lines 53-60, commit 004f8a0), the settings its MuJoCo results used."""

    gamma: float = _gamma(0.99)
    buffer_size: int = _buffer_size(1_000_000)
    batch_size: int = _batch_size(256)
    train_frequency: int = _train_frequency(1)
    gradient_steps: int = _gradient_steps(1)
    tau: float = Field(default=0.005, gt=0, le=1, description="Polyak coefficient for the target networks.")
    network: ActorCriticNetworkSpec = Field(
        default_factory=ActorCriticNetworkSpec,
        description="Actor and Q-network MLP shape.",
    )


class SACConfig(ContinuousReplayConfig):
    """Soft Actor-Critic: a tanh-squashed Gaussian actor, twin soft Q-networks and automatic entropy
    tuning. Defaults: CleanRL, cleanrl/sac_continuous_action.py lines 53-65 (commit 004f8a0)."""

    learning_starts: int = Field(
        default=5_000, ge=0, description="Env steps of uniformly random actions before the first update."
    )
    policy_learning_rate: float = Field(default=3e-4, gt=0, le=1, description="Adam learning rate of the actor.")
    q_learning_rate: float = Field(
        default=1e-3, gt=0, le=1, description="Adam learning rate of the Q-networks and the entropy coefficient."
    )
    alpha: float = Field(
        default=0.2, gt=0, le=100,
        description="Entropy coefficient when autotuneAlpha is off (tuning starts from 1, as CleanRL's does).",
    )
    autotune_alpha: bool = Field(
        default=True, description="Tune the entropy coefficient towards targetEntropy (Haarnoja et al. 2018b)."
    )
    target_entropy: float | None = Field(
        default=None, ge=-1000, le=1000, description="Entropy the tuning aims at; unset: minus the action dimension."
    )


class TD3Config(ContinuousReplayConfig):
    """Twin Delayed DDPG: a deterministic actor with Gaussian exploration noise, clipped double Q,
    target policy smoothing and delayed actor updates. Defaults: CleanRL,
    cleanrl/td3_continuous_action.py lines 49-70 (commit 004f8a0)."""

    learning_starts: int = Field(
        default=25_000, ge=0, description="Env steps of uniformly random actions before the first update."
    )
    learning_rate: float = Field(default=3e-4, gt=0, le=1, description="Adam learning rate of actor and critics.")
    exploration_noise: float = Field(
        default=0.1, ge=0, le=10, description="Std of the acting noise, in units of half the action range."
    )
    policy_noise: float = Field(
        default=0.2, ge=0, le=10, description="Std of the target policy smoothing noise, in half action ranges."
    )
    noise_clip: float = Field(
        default=0.5, ge=0, le=10, description="The smoothing noise is clipped to +-this (in half action ranges)."
    )
    policy_delay: int = Field(
        default=2, ge=1, le=100, description="Critic updates per actor (and target) update."
    )


# ---- BDQ's preference-alignment head (trainer/kuberl/trainer/preferences/) ----------------------

#: Where the learner pod mounts `preference.configMap` (its key pairs.jsonl is the pairs file).
PREFERENCE_CONFIGMAP_MOUNT = "/etc/kuberl/preferences"


class OverloadSpec(_Model):
    utilisation_above: float = Field(
        default=0.9, gt=0, le=10,
        description="A step counts as overloaded when the env's info utilisation exceeds this."
    )
    weight: float = Field(default=1.0, ge=0, le=1000, description="Weight of one overloaded step.")


class PreferenceTeacherSpec(_Model):
    """The synthetic teacher: of two segments, the one with the lower violation score is preferred, where
    score = sloViolation * SLO-violation steps + overload.weight * overloaded steps
          + droppedLowPriority * dropped low-priority requests (info keys slo_violation, utilisation,
            dropped_low_priority; the env must report those whose weight is above 0)."""

    slo_violation: float = Field(default=1.0, ge=0, le=1000, description="Weight of one SLO-violation step.")
    overload: OverloadSpec | None = Field(
        default_factory=OverloadSpec, description="Overload (utilisation above a bound); null: not counted."
    )
    dropped_low_priority: float = Field(
        default=0.0, ge=0, le=1000,
        description="Weight of one dropped or shed low-priority request (AutoscalingMulti-v0's info).",
    )
    mistake_rate: float = Field(
        default=0.0, ge=0, le=0.5,
        description="Probability that a label is flipped (BPref's mistake teacher); 0: the exact teacher.",
    )
    pairs_per_iteration: int = Field(
        default=8, ge=0, le=1024, description="Segment pairs the teacher labels per learner iteration."
    )


class PreferenceSpec(_Model):
    """Bradley-Terry preference head (Christiano et al. 2017; Ibarz et al. 2018) on BDQ's shared trunk."""

    RULES = (Rule("!has(self.pairsFile) || !has(self.configMap)",
                  "pairsFile and configMap exclude each other: the ConfigMap's pairs.jsonl is the file",
                  lambda p: p.pairs_file is None or p.config_map is None),)

    weight: float = Field(
        default=1.0, ge=0, le=100,
        description="Weight of the preference (Bradley-Terry) loss added to the TD loss in the same backward "
        "pass; its gradient reaches the shared trunk. The TD loss itself is unchanged.",
    )
    segment_length: int = Field(
        default=25, ge=2, le=1000, description="Steps per trajectory segment (consecutive steps of one env copy)."
    )
    batch_size: int = Field(default=32, ge=1, le=4096, description="Ranked pairs per preference-loss step.")
    teacher: PreferenceTeacherSpec | None = Field(
        default_factory=PreferenceTeacherSpec,
        description="Synthetic teacher from the spec's constraints; null: only pairs people rank.",
    )
    pairs_file: str | None = Field(
        default=None, min_length=1, max_length=1024,
        description="JSONL of ranked pairs, re-read while training; relative paths are under the run "
        "directory. Unset: preferences/pairs.jsonl in the run directory (on a cluster, the checkpoint "
        "volume), or pairs.jsonl of configMap when set.",
    )
    config_map: DnsSubdomain | None = Field(
        default=None,
        description="ConfigMap holding ranked pairs under the key pairs.jsonl, mounted into the learner pod; "
        "edits reach training without a restart (the kubelet refreshes the volume).",
    )
    held_out_fraction: float = Field(
        default=0.2, ge=0, le=0.5, description="Fraction of ranked pairs kept out of training to measure accuracy."
    )
    candidates_per_iteration: int = Field(
        default=1, ge=0, le=64,
        description="Candidate segment pairs per iteration written to preferences/segments.jsonl for people "
        "to rank (`kuberl preferences RUN_DIR`).",
    )
    reward_shaping: float = Field(
        default=0.0, ge=0, le=10,
        description="beta: TD targets use r + beta * the head's standardised step score of (s, a); 0 (default): "
        "the head only regularises the trunk.",
    )
    max_pairs: int = Field(default=20_000, ge=16, le=1_000_000, description="Ranked pairs kept (oldest dropped).")


class QLearningConfig(_Model):
    """Tabular Q-learning over a discretised observation."""

    learning_rate: float = Field(default=0.1, gt=0, le=1, description="Step size alpha.")
    gamma: float = Field(default=0.99, gt=0, le=1, description="Discount factor.")
    bins: list[int] = Field(
        default=[],
        description="Bins per observation dimension for a Box observation (one entry per dimension, or "
        "one entry applied to all); ignored for Discrete observations.",
    )
    low: list[float] = Field(default=[], description="Lower clip per dimension (defaults to the space's low).")
    high: list[float] = Field(
        default=[], description="Upper clip per dimension (defaults to the space's high)."
    )
    exploration_initial: float = Field(default=1.0, ge=0, le=1, description="Initial epsilon.")
    exploration_final: float = Field(default=0.05, ge=0, le=1, description="Final epsilon.")
    exploration_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Fraction of the budget over which epsilon decays."
    )

    @field_validator("bins")
    @classmethod
    def _bins_positive(cls, v: list[int]) -> list[int]:
        for b in v:
            if not 1 <= b <= 1000:
                raise ValueError(f"every bin count must be between 1 and 1000, got {b}")
        return v


Hyperparameters = PPOConfig | DQNConfig | BDQConfig | QLearningConfig | SACConfig | TD3Config


class AlgorithmSpec(_Model):
    name: AlgorithmName = Field(description="Learning algorithm.")
    ppo: PPOConfig = Field(default_factory=PPOConfig, description="PPO hyperparameters (used when name=PPO).")
    dqn: DQNConfig = Field(default_factory=DQNConfig, description="DQN hyperparameters (used when name=DQN).")
    bdq: BDQConfig = Field(default_factory=BDQConfig, description="BDQ hyperparameters (used when name=BDQ).")
    q_learning: QLearningConfig = Field(
        default_factory=QLearningConfig, description="Tabular Q-learning hyperparameters (name=QLearning)."
    )
    sac: SACConfig = Field(default_factory=SACConfig, description="SAC hyperparameters (used when name=SAC).")
    td3: TD3Config = Field(default_factory=TD3Config, description="TD3 hyperparameters (used when name=TD3).")

    def hyperparameters(self) -> Hyperparameters:
        by_name: dict[AlgorithmName, Hyperparameters] = {
            AlgorithmName.PPO: self.ppo,
            AlgorithmName.DQN: self.dqn,
            AlgorithmName.BDQ: self.bdq,
            AlgorithmName.QLEARNING: self.q_learning,
            AlgorithmName.SAC: self.sac,
            AlgorithmName.TD3: self.td3,
        }
        return by_name[self.name]


# --------------------------------------------------------------------------------------------
# Environment, workers, learner, head
# --------------------------------------------------------------------------------------------


#: gymnasium's id syntax `module:Env-vN`, KubeRL's `module:Class` and a PettingZoo `module:factory` name code
#: to import.
MODULE_SEPARATOR = ":"


class AgentPolicies(str, enum.Enum):
    SHARED = "shared"
    SELF_PLAY = "selfPlay"
    GROUPS = "groups"


_GROUP_NAME = re.compile(r"[a-z][a-z0-9_-]{0,30}")


def is_group_name(name: str) -> bool:
    return _GROUP_NAME.fullmatch(name) is not None


def _check_group_name(name: str) -> str:
    # Checked here, not in the CRD: the API server takes no pattern on a map's keys (patternProperties).
    if not is_group_name(name):
        raise ValueError(f"group name {name[:80]!r} is not valid: a lowercase letter, then at most 30 lowercase "
                         "letters, digits, '_' or '-' (it names the group's metrics and TensorBoard tags)")
    return name


#: A policy group's name (a metric label and a TensorBoard tag).
GroupName = Annotated[str, AfterValidator(_check_group_name)]
#: The most policy groups a job may have (environment.multiAgent.groups).
MAX_POLICY_GROUPS = 8
#: A PettingZoo agent's name, as the env's possible_agents lists it.
AgentName = Annotated[str, Field(min_length=1, max_length=63)]


class SelfPlaySpec(_Model):
    """The frozen opponents of `policies: selfPlay`."""

    # rl-baselines3-zoo has no self-play settings; these are the ones KubeRL's Tic-Tac-Toe example was tuned
    # to (examples/tictactoe-dqn.yaml: refresh every 100 updates, half the opponent's moves random), which
    # beat the seed project's figures (bench/results/tictactoe.json).
    refresh_updates: int = Field(
        default=100, ge=0, le=1_000_000_000,
        description="Gradient updates between new frozen copies of the policy (0: every weights change).")
    opponent_epsilon: float = Field(
        default=0.5, ge=0, le=1,
        description="Share of the opponents' moves played uniformly at random.")


class MultiAgentSpec(_Model):
    """A PettingZoo environment, and how its agents map to policies."""

    RULES = (Rule("!has(self.selfPlay) || self.policies == 'selfPlay'",
                  "selfPlay is set only with policies: selfPlay",
                  lambda m: m.self_play is None or m.policies == AgentPolicies.SELF_PLAY,
                  lambda m: f"policies {m.policies.value}"),
             Rule("has(self.groups) == (has(self.policies) && self.policies == 'groups')",
                  "groups goes with policies: groups",
                  lambda m: (m.groups is not None) == (m.policies == AgentPolicies.GROUPS),
                  lambda m: f"policies {m.policies.value}"))

    policies: AgentPolicies = Field(
        default=AgentPolicies.SHARED,
        description="shared: one policy acts for every agent and learns from all their steps (parameter "
        "sharing); every agent needs the same observation and action spaces. "
        "selfPlay: the policy plays one seat of each game against frozen past versions of itself. groups: a "
        "policy per group of agents.")
    self_play: SelfPlaySpec | None = Field(default=None, description="The opponents of policies: selfPlay.")
    groups: dict[GroupName, Annotated[list[AgentName], Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=2, max_length=MAX_POLICY_GROUPS,
        description="Group name -> its agents (policies: groups).")
    agent_id_in_observation: bool = Field(
        default=False,
        description="Append the agent's one-hot index (in its group's, or possible_agents', order) to its "
        "observation.")


class EnvironmentSpec(_Model):
    id: str = Field(
        min_length=1,
        max_length=253,
        description="A gymnasium id (CartPole-v1), a KubeRL environment (kuberl/TicTacToe-v0, "
        "kuberl/Autoscaling-v0, kuberl/AutoscalingMulti-v0), a user class as module:Class, or with multiAgent a "
        "PettingZoo env: an id of PettingZoo's registry (butterfly/pistonball-v6) or its module and factory "
        "(mpe2.simple_spread_v3:parallel_env).",
    )
    kwargs: JsonObject = Field(
        default_factory=dict,
        description="Keyword arguments for the environment constructor.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    max_episode_steps: int | None = Field(
        default=None, ge=1, description="Truncate episodes at this length (overrides the registered limit)."
    )
    multi_agent: MultiAgentSpec | None = Field(
        default=None, description="Set for a PettingZoo environment (many agents), which id names.")


class Resources(_Model):
    """Kubernetes container resources (quantities as strings, e.g. "500m", "2Gi")."""

    RULES = RESOURCES_RULES
    requests: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=RESOURCES_MAX, description="Resource requests.")
    limits: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=RESOURCES_MAX, description="Resource limits.")

    @model_validator(mode="after")
    def _as_the_api_server_checks(self) -> Resources:
        """What the API server refuses in a container's resources (ValidateResourceRequirements) beyond
        RULES: quantities compared, which CEL on Kubernetes 1.27 cannot do."""
        problems = []
        for name, limit in self.limits.items():
            if kube.is_extended_resource(name) and kube.parse_quantity(limit).denominator != 1:
                problems.append(f"limits.{name} {limit!r} must be a whole number (extended resources come in "
                                "whole units)")
        for name, request in self.requests.items():
            value = kube.parse_quantity(request)
            if kube.is_extended_resource(name) and value.denominator != 1:
                problems.append(f"requests.{name} {request!r} must be a whole number (extended resources come "
                                "in whole units)")
            its_limit = self.limits.get(name)
            overcommit = not (kube.is_extended_resource(name) or name.startswith(kube.HUGEPAGES_PREFIX))
            if its_limit is None:
                continue  # RULES: an extended resource or hugepages request needs a limit
            if not overcommit and value != kube.parse_quantity(its_limit):
                problems.append(f"requests.{name} {request!r} must equal limits.{name} {its_limit!r}: extended "
                                "resources and hugepages cannot be overcommitted")
            elif value > kube.parse_quantity(its_limit):
                problems.append(f"requests.{name} {request!r} must be less than or equal to limits.{name} "
                                f"{its_limit!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RolloutWorkersSpec(_Model):
    replicas: int = Field(
        default=2, ge=1, le=512, description="Rollout workers: Ray actors locally, worker pods on a cluster."
    )
    envs_per_worker: int = Field(
        default=8, ge=1, le=4096, description="Vectorised environment copies stepped by each worker."
    )
    resources: Resources = Field(
        default_factory=lambda: Resources(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "2Gi"}),
        description="Resources of each rollout-worker pod.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=NODE_SELECTOR_MAX, description="Node selector for worker pods.",
        json_schema_extra={"x-kubernetes-validations": NODE_SELECTOR_RULES})
    template: Annotated[dict[str, Any] | None, _template_check("rolloutWorkers"), _TEMPLATE_SCHEMA] = (
        _template_field("rolloutWorkers"))


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class LearnerSpec(_Model):
    replicas: int = Field(
        default=1, ge=1, le=64,
        description="Data-parallel learners: each trains on its shard of every batch and gradients are "
        "averaged every update (torch.distributed: gloo on CPU, NCCL on GPU). Rank 0 writes checkpoints and "
        "metrics. Not for QLearning.",
    )
    device: Device = Field(default=Device.AUTO, description="auto: cuda when available, else cpu.")
    resources: Resources = Field(
        default_factory=lambda: Resources(requests={"cpu": "1", "memory": "2Gi"}, limits={"memory": "4Gi"}),
        description="Resources of the learner pod (add nvidia.com/gpu to limits for a GPU learner).",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=NODE_SELECTOR_MAX, description="Node selector for the learner pod.",
        json_schema_extra={"x-kubernetes-validations": NODE_SELECTOR_RULES})
    template: Annotated[dict[str, Any] | None, _template_check("learner"), _TEMPLATE_SCHEMA] = (
        _template_field("learner"))
    threads: int | None = Field(
        default=None, ge=1, le=256,
        description="torch, OpenMP, MKL and OpenBLAS threads of each learner (default: its pod's CPUs, the CPU "
                    "limit else the request, rounded up; locally, this machine's cores less the rollout workers')."
    )


class HeadSpec(_Model):
    resources: Resources = Field(
        default_factory=lambda: Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "2Gi"}),
        description="Resources of the Ray head pod.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=NODE_SELECTOR_MAX, description="Node selector for the head pod.",
        json_schema_extra={"x-kubernetes-validations": NODE_SELECTOR_RULES})
    template: Annotated[dict[str, Any] | None, _template_check("head"), _TEMPLATE_SCHEMA] = (
        _template_field("head"))


class CollectionMode(str, enum.Enum):
    SYNC = "sync"
    ASYNC = "async"


class CollectionSpec(_Model):
    mode: CollectionMode = Field(
        default=CollectionMode.SYNC,
        description="sync: collect, then learn. async: workers keep producing while the learner trains "
        "(off-policy algorithms only: DQN, BDQ, QLearning).",
    )
    max_staleness: int = Field(
        default=1000,
        ge=0,
        description="async: a worker's policy is at most this many gradient updates old.",
    )
    queue_size: int = Field(
        default=4, ge=1, le=1024, description="async: batches in flight per worker before it waits."
    )
    fragment_steps: int = Field(
        default=32, ge=1, le=100_000, description="Env steps per env in one off-policy batch from a worker."
    )


class StoppingSpec(_Model):
    RULES = (Rule("has(self.maxEpisodes) || has(self.maxEnvSteps) || has(self.maxWallClockSeconds)",
                  "at least one of maxEpisodes, maxEnvSteps or maxWallClockSeconds is required "
                  "(targetReturn alone may never be reached)",
                  lambda s: (s.max_episodes, s.max_env_steps, s.max_wall_clock_seconds) != (None, None, None)),)
    target_return: float | None = Field(
        default=None, description="Stop when the mean return over the last returnWindow episodes reaches this."
    )
    return_window: int = Field(
        default=100, ge=1, le=100_000, description="Episodes averaged for targetReturn."
    )
    max_episodes: int | None = Field(default=None, ge=1, description="Stop after this many training episodes.")
    max_env_steps: int | None = Field(default=None, ge=1, description="Stop after this many env steps.")
    max_wall_clock_seconds: float | None = Field(
        default=None, gt=0, description="Stop after this much training time."
    )


class VolumeSpec(_Model):
    RULES = (Rule("!has(self.claimName) || !has(self.sizeLimit)",
                  "claimName and sizeLimit exclude each other: sizeLimit bounds the emptyDir used when there "
                  "is no claim",
                  lambda v: v.claim_name is None or v.size_limit is None),)
    claim_name: DnsSubdomain | None = Field(
        default=None, description="PersistentVolumeClaim for checkpoints; emptyDir when unset."
    )
    size_limit: Quantity | None = Field(default=None, description="emptyDir size limit (when no claim).")


#: An HTTP(S) service's address: http or https, a host, an optional port and path; no credentials in it
#: (they come from a Secret the spec names, never from the job's text).
HTTP_URL_PATTERN = r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%!$&'()*+,;=:@/\-]*)?$"
#: s3://bucket/prefix: a bucket name as S3 allows it (3-63 lower-case letters, digits, dots and hyphens),
#: then a prefix of path-safe characters.
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[A-Za-z0-9._\-/]*)?$"


def _dot_dot(path: str | None) -> bool:
    """A '..' segment: a store or a proxy that normalises the request's path would take it out of the prefix
    (path-style, even out of the bucket)."""
    return path is not None and ("/../" in path or path.endswith("/.."))


class ObjectStoreSpec(_Model):
    """Checkpoints in S3 or an S3-compatible store (MinIO, SeaweedFS, Ceph): each one's object, then a small
    manifest that commits it; the last keepLast kept."""

    RULES = (Rule("!has(self.resumeFrom) || self.resumeFrom != self.uri",
                  "resumeFrom names another run's checkpoints; this run's own (uri) it resumes from anyway",
                  lambda v: v.resume_from is None or v.resume_from != v.uri),
             Rule("!self.uri.contains('/../') && !self.uri.endsWith('/..') && "
                  "(!has(self.resumeFrom) || (!self.resumeFrom.contains('/../') && !self.resumeFrom.endsWith('/..')))",
                  "a path has no '..' segment",
                  lambda v: not any(_dot_dot(p) for p in (v.uri, v.resume_from))))
    uri: str = Field(
        max_length=1024, pattern=S3_URI_PATTERN,
        description="s3://bucket/prefix: the run's checkpoints, under the prefix. The path is the run's "
                    "identity: a learner restarted, or a new job naming the same path, continues from it.")
    endpoint: str | None = Field(
        default=None, max_length=2048, pattern=HTTP_URL_PATTERN,
        description="The store's URL (http:// or https://, no user:password in it), addressed path-style; "
                    "default: AWS S3 in `region`. The learner must reach it (a cluster's egress rules permitting).")
    region: str = Field(default="us-east-1", pattern=r"^[a-z0-9][a-z0-9\-]{0,31}$",
                        description="The region requests are signed for (most S3-compatible stores take any).")
    credentials_secret: DnsSubdomain | None = Field(
        default=None,
        description="A Secret in the job's namespace whose keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and "
                    "(optional) AWS_SESSION_TOKEN the learner gets as those environment variables (the operator "
                    "never reads it). Locally those environment variables themselves.")
    resume_from: str | None = Field(
        default=None, max_length=1024, pattern=S3_URI_PATTERN,
        description="Another run's checkpoints (s3://bucket/prefix, the same store and credentials): a run "
                    "with none of its own yet starts from the newest there, counters and all.")


class CheckpointingSpec(_Model):
    RULES = (Rule("!has(self.s3) || !has(self.enabled) || self.enabled",
                  "s3 keeps the run's checkpoints and resumes from them: with enabled: false there are none; "
                  "remove s3 or set enabled: true",
                  lambda v: v.s3 is None or v.enabled),)
    enabled: bool = Field(default=True, description="Write checkpoints.")
    interval_iterations: int | None = Field(
        default=None, ge=1, description="Checkpoint every this many iterations."
    )
    interval_seconds: float | None = Field(
        default=60.0, gt=0, description="Checkpoint at most this often in seconds (and at the end)."
    )
    keep_last: int = Field(default=3, ge=1, le=1000, description="Checkpoints kept; older ones are deleted.")
    volume: VolumeSpec = Field(default_factory=VolumeSpec, description="Where checkpoints live on a cluster.")
    s3: ObjectStoreSpec | None = Field(
        default=None,
        description="Also keep checkpoints in an S3-compatible object store, and resume from it: the learner "
                    "loads the newest complete checkpoint there (or, when there is none, resumeFrom's) "
                    "before it trains.")


class MLflowTrackingSpec(_Model):
    """An MLflow tracking server the learner logs to: the resolved job as parameters, every iteration's
    metrics, and the run's files (summary, evaluation, learning curve, the exported policy) as artifacts."""

    tracking_uri: str = Field(
        max_length=2048, pattern=HTTP_URL_PATTERN,
        description="The tracking server's URL (http:// or https://, no user:password in it), as "
                    "MLFLOW_TRACKING_URI takes it; the learner must reach it (a cluster's egress rules permitting).")
    experiment: str | None = Field(
        default=None, min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Experiment name, created when absent; default: the job's name.")
    run_name: str | None = Field(
        default=None, min_length=1, max_length=250, pattern=r"^[^\x00-\x1f\x7f]+$",
        description="The run's name; default: the job's name.")
    credentials_secret: DnsSubdomain | None = Field(
        default=None,
        description="A Secret in the job's namespace whose keys token, or username and password, the learner "
                    "gets as MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (the "
                    "operator never reads it). Locally those environment variables themselves.")


class TrackingSpec(_Model):
    mlflow: MLflowTrackingSpec | None = Field(default=None, description="Log the run to MLflow.")


class EvaluationOpponent(str, enum.Enum):
    RANDOM = "random"
    SELF = "self"


class EvaluationSuite(_Model):
    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$", description="Suite name."
    )
    kind: Literal["episodes", "opponent", "baseline"] = Field(
        default="episodes",
        description="episodes: greedy policy on the env; opponent: games vs an opponent (two-player envs); "
        "baseline: a named baseline policy on the same seeds for comparison.",
    )
    opponent: EvaluationOpponent | None = Field(default=None, description="Opponent, for kind=opponent.")
    agent_first: bool | None = Field(default=None, description="Agent moves first, for kind=opponent.")
    baseline: Literal["random", "threshold"] | None = Field(
        default=None, description="Baseline policy, for kind=baseline."
    )
    baseline_params: JsonObject = Field(
        default_factory=dict,
        description="Baseline settings, for kind=baseline. threshold: upper and lower utilisation (and "
        "tier, priority on kuberl/AutoscalingMulti-v0); those left out are grid-searched on "
        "tuning_episodes (default 5) seeds after the evaluation seeds. random: seed.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    episodes: int = Field(default=100, ge=1, le=1_000_000, description="Episodes or games.")
    env_kwargs: JsonObject = Field(
        default_factory=dict,
        description="Overrides of environment.kwargs for this suite.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class EvaluationSpec(_Model):
    enabled: bool = Field(default=True, description="Evaluate the final policy.")
    episodes: int = Field(default=100, ge=1, le=1_000_000, description="Deterministic evaluation episodes.")
    seed: int = Field(default=10_000, ge=0, description="First seed of the evaluation episodes.")
    suites: list[EvaluationSuite] = Field(
        default_factory=list, max_length=32, description="Extra evaluation suites (opponents, baselines)."
    )


NOT_A_RAY_PORT = Rule(
    f"!(self in {sorted(kube.RAY_PORTS)} || "
    f"(self >= {kube.RAY_WORKER_PORTS[0]} && self <= {kube.RAY_WORKER_PORTS[1]}))",
    "must not be one of Ray's ports in the job's pods: "
    + ", ".join(f"{p} ({what})" for p, what in kube.RAY_PORTS.items())
    + f", {kube.RAY_WORKER_PORTS[0]}-{kube.RAY_WORKER_PORTS[1]} (Ray workers); 0 is the default 8080",
    lambda port: not kube.is_ray_port(port), kube.ray_port_use)
_RAY_PORT_CHECK, _RAY_PORT_SCHEMA = on_field(NOT_A_RAY_PORT)


class MetricsSpec(_Model):
    enabled: bool = Field(default=True, description="Serve Prometheus /metrics from the learner.")
    port: Annotated[int, _RAY_PORT_CHECK, _RAY_PORT_SCHEMA] = Field(
        default=8080, ge=0, le=65535, description="Metrics port (0 picks a free one locally).")


class ServingSpec(_Model):
    """Serve the trained policy once the job succeeds: a Deployment runs `kuberl serve` on the checkpoint
    claim (Open Inference Protocol + /act) behind a Service; `status.servingEndpoint` is its URL."""

    RULES = (Rule("!has(self.port) || !has(self.metricsPort) || self.port != self.metricsPort",
                  "port and metricsPort must differ: the protocol and /metrics-only listeners each need one",
                  lambda s: s.port != s.metrics_port, lambda s: f"both are {s.port}"),)
    replicas: int = Field(default=1, ge=1, le=100, description="Serving pods (each answers every request).")
    resources: Resources = Field(
        default_factory=lambda: Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "2Gi"}),
        description="Resources of each serving pod.",
    )
    port: int = Field(default=8000, ge=1024, le=65535,
                      description="HTTP port of the protocol, /act and /metrics (the Service's port too).")
    metrics_port: int = Field(default=9090, ge=1024, le=65535,
                              description="Port serving only /metrics, named `metrics` for a PodMonitor.")
    max_batch: int = Field(default=256, ge=1, le=65_536,
                           description="Most observations one forward pass takes from concurrent requests.")
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=NODE_SELECTOR_MAX, description="Node selector for serving pods.",
        json_schema_extra={"x-kubernetes-validations": NODE_SELECTOR_RULES})
    template: Annotated[dict[str, Any] | None, _template_check("serving"), _TEMPLATE_SCHEMA] = (
        _template_field("serving"))


SERVING_NEEDS_CLAIM = ("serving needs checkpointing.volume.claimName: the serving pods read the policy from "
                       "the checkpoint claim (an emptyDir dies with the learner pod)")


DATA_PARALLEL_NEEDS_GRADIENTS = ("learner.replicas > 1 needs a gradient-based algorithm (PPO, DQN, BDQ), got "
                                 "algorithm.name QLearning (a table has no gradients to average)")
DATA_PARALLEL_WITHOUT_PREFERENCE = (
    "learner.replicas > 1 cannot be combined with algorithm.bdq.preference yet: the preference head's pairs "
    "and segments live with one learner; set learner.replicas: 1 or remove algorithm.bdq.preference")
DATA_PARALLEL_NOT_FOR_CONTINUOUS = (
    "learner.replicas > 1 is not built for SAC and TD3 yet: their updates draw noise on each learner, and the "
    "check that data-parallel learners reach one learner's parameters covers PPO, DQN and BDQ only; set "
    "learner.replicas: 1")
_MANY_LEARNERS_CEL = "has(self.learner) && has(self.learner.replicas) && self.learner.replicas > 1"


class RLTrainingJobSpec(_Model):
    RULES = (
        Rule(f"!({_MANY_LEARNERS_CEL} && self.algorithm.name == 'QLearning')", DATA_PARALLEL_NEEDS_GRADIENTS,
             lambda s: not (s.learner.replicas > 1 and s.algorithm.name == AlgorithmName.QLEARNING)),
        Rule(f"!({_MANY_LEARNERS_CEL} && (self.algorithm.name == 'SAC' || self.algorithm.name == 'TD3'))",
             DATA_PARALLEL_NOT_FOR_CONTINUOUS,
             lambda s: not (s.learner.replicas > 1 and s.algorithm.name in (AlgorithmName.SAC, AlgorithmName.TD3))),
        Rule(f"!({_MANY_LEARNERS_CEL} && self.algorithm.name == 'BDQ' && has(self.algorithm.bdq) && "
             "has(self.algorithm.bdq.preference))", DATA_PARALLEL_WITHOUT_PREFERENCE,
             lambda s: not (s.learner.replicas > 1 and s.algorithm.name == AlgorithmName.BDQ
                            and s.algorithm.bdq.preference is not None)),
        Rule("!has(self.collection) || !has(self.collection.mode) || self.collection.mode != 'async' || "
             "self.algorithm.name != 'PPO'",
             "collection.mode: async needs an off-policy algorithm (DQN, BDQ, QLearning, SAC, TD3), not PPO",
             lambda s: not (s.collection.mode == CollectionMode.ASYNC and s.algorithm.name == AlgorithmName.PPO)),
        Rule("!has(self.serving) || (has(self.checkpointing) && has(self.checkpointing.volume) && "
             "has(self.checkpointing.volume.claimName))", SERVING_NEEDS_CLAIM,
             lambda s: s.serving is None or s.checkpointing.volume.claim_name is not None),
    )
    algorithm: AlgorithmSpec = Field(description="Learning algorithm and hyperparameters.")
    environment: EnvironmentSpec = Field(description="The environment to train on.")
    rollout_workers: RolloutWorkersSpec = Field(
        default_factory=RolloutWorkersSpec, description="Rollout workers (act only)."
    )
    learner: LearnerSpec = Field(default_factory=LearnerSpec, description="The learner (learns only).")
    head: HeadSpec = Field(default_factory=HeadSpec, description="The Ray head (cluster only).")
    collection: CollectionSpec = Field(
        default_factory=CollectionSpec, description="How collection and learning interleave."
    )
    stopping: StoppingSpec = Field(description="When training stops.")
    checkpointing: CheckpointingSpec = Field(default_factory=CheckpointingSpec, description="Checkpoints.")
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec, description="Final evaluation.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus metrics.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Random seed for envs, networks and sampling.")
    image: ImageReference | None = Field(
        default=None, max_length=512, description="Trainer image; the operator's default when unset."
    )
    suspend: bool = Field(default=False, description="Delete the job's pods and keep it; false resumes.")
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the job this long after it succeeds or fails."
    )
    backoff_limit: int = Field(
        default=3, ge=0, le=100,
        description="Restarts of the learner and of the Ray head, counted together, before the job fails. A restart "
                    "after the cluster took the pod away (a drain's eviction, preemption) is not counted.")
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job when it has been active longer than this."
    )
    startup_deadline_seconds: int | None = Field(
        default=None, ge=10, le=86_400,
        description="Fail the job (StartupDeadlineExceeded, pods deleted) when it is not Running this long "
        "after its pods were created, resumed or admitted by Kueue (queue time does not count); unset: no limit.",
    )
    queue_name: DnsSubdomain | None = Field(
        default=None, max_length=63,
        description="Kueue LocalQueue: the job's pods are created as one Kueue pod group, gated until Kueue "
        "admits all of them (the kueue.x-k8s.io/queue-name label on the job says the same).",
    )
    serving: ServingSpec | None = Field(
        default=None, description="Serve the trained policy after the job succeeds (needs a checkpoint claim)."
    )
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Experiment tracking: runs logged to a tracking server.")

    @model_validator(mode="after")
    def _templates_fit(self) -> RLTrainingJobSpec:
        shaped = {"head": (self.head.template, 1),
                  "rolloutWorkers": (self.rollout_workers.template, self.rollout_workers.replicas),
                  "learner": (self.learner.template, self.learner.replicas),
                  "serving": (self.serving.template, self.serving.replicas) if self.serving else (None, 0)}
        cost = {role: pod_template.template_bytes(t) * pods for role, (t, pods) in shaped.items()}
        if sum(cost.values()) > pod_template.MAX_JOB_TEMPLATE_BYTES:
            parts = ", ".join(f"{role} {pod_template.template_bytes(shaped[role][0]):,} bytes x {shaped[role][1]}"
                              for role in cost if cost[role])
            raise ValueError(f"the pod templates times their pods come to {sum(cost.values()):,} bytes ({parts}); "
                             f"at most {pod_template.MAX_JOB_TEMPLATE_BYTES:,}: fewer replicas or smaller templates")
        return self


# --------------------------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------------------------


class StopReason(str, enum.Enum):
    """Why training stopped: the first stopping rule met, or SIGTERM (the learner's pod was asked to stop)."""

    TARGET_RETURN = "target_return"
    MAX_ENV_STEPS = "max_env_steps"
    MAX_EPISODES = "max_episodes"
    MAX_WALL_CLOCK_SECONDS = "max_wall_clock_seconds"
    SIGNAL = "signal"


class Phase(str, enum.Enum):
    PENDING = "Pending"
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class Condition(_Model):
    type: str = Field(description="Running, Degraded, Complete, Failed, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="Generation this was computed for.")


class Progress(_Model):
    episodes: int = Field(default=0, ge=0, description="Training episodes finished.")
    env_steps: int = Field(default=0, ge=0, description="Environment steps taken.")
    episodes_per_second: float = Field(default=0.0, ge=0, description="Recent episode rate.")
    env_steps_per_second: float = Field(default=0.0, ge=0, description="Recent env-step rate.")
    mean_return: float | None = Field(default=None, description="Mean return over the stopping window.")
    returns_by_policy: dict[GroupName, float] | None = Field(
        default=None, max_length=MAX_POLICY_GROUPS,
        description="Each policy group's mean return in the learner's last iteration (multiAgent.groups).")
    wall_clock_seconds: float = Field(default=0.0, ge=0, description="Training time so far.")
    gradient_updates: int = Field(default=0, ge=0, description="Gradient updates applied.")
    iterations: int = Field(default=0, ge=0, description="Learner iterations.")


class RLTrainingJobStatus(_Model):
    phase: Phase = Field(default=Phase.PENDING, description="Lifecycle phase.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
    observed_generation: int | None = Field(default=None, description="Last spec generation acted on.")
    start_time: datetime | None = Field(default=None, description="When the job's pods were first created.")
    time_to_first_step_seconds: float | None = Field(
        default=None, ge=0, description="Seconds from the job's creation (kubectl apply) to the learner's first env "
                                        "steps, to 0.1: the start-up a user waits through. Set once.")
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")
    workers_ready: int = Field(default=0, ge=0, description="Rollout workers ready.")
    workers_desired: int = Field(default=0, ge=0, description="Rollout workers wanted.")
    workers: str = Field(default="0/0", description="ready/desired, for kubectl get.")
    learner_restarts: int = Field(default=0, ge=0, description="Times the learner was restarted.")
    head_restarts: int = Field(default=0, ge=0, description="Times the head was recreated.")
    disruption_restarts: int = Field(
        default=0, ge=0, description="Of those restarts, the ones after the cluster took the pod away (a drain's "
                                     "eviction, preemption: its DisruptionTarget condition): not counted against "
                                     "backoffLimit.")
    disrupted_pods: list[str] = Field(
        default_factory=list, max_length=8,
        description="The job's head and learner pods seen disrupted and not yet replaced (the operator's own record, "
                    "kept until the replacement).")
    progress: Progress = Field(default_factory=Progress, description="Training progress from the learner.")
    last_checkpoint: str | None = Field(default=None, description="Newest checkpoint file.")
    last_checkpoint_time: datetime | None = Field(default=None, description="When it was written.")
    checkpoint_seconds: float | None = Field(
        default=None, ge=0, description="The longest one checkpoint of this job has taken, to disk and (with "
                                        "spec.checkpointing.s3) to the store, to 0.1, as the learner reports it: "
                                        "each new learner pod's grace period is sized from it.")
    stopped_by: StopReason | None = Field(
        default=None, description="Why training stopped, from the learner's final metrics: the stopping rule "
                                  "met first (target_return, max_env_steps, max_episodes, max_wall_clock_seconds).")
    evaluation: dict[str, Any] | None = Field(
        default=None,
        description="Final evaluation results by suite.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    serving_endpoint: str | None = Field(
        default=None, description="URL of the policy server (spec.serving), once the job has succeeded.")
    reason: str | None = Field(default=None, description="Why the job failed (CamelCase).")
    message: str | None = Field(default=None, description="Detail of the failure.")


class ObjectMeta(BaseModel):
    """The parts of metadata KubeRL reads; everything else passes through."""

    model_config = ConfigDict(extra="allow")
    name: Annotated[str, AfterValidator(kube.check_job_name)] = Field(
        description=f"DNS-1035 label, at most {kube.JOB_NAME_MAX_LENGTH} characters (pod and Service names "
        "add suffixes).",
    )
    namespace: str = Field(default="default", description="Namespace.")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


#: Kueue's label naming a LocalQueue (on the job, as on any workload Kueue manages).
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"

#: CEL rules at the CRD's root, where the API server lets them read metadata.name.
def _valid_job_name(name: str) -> bool:
    try:
        kube.check_job_name(name)
    except ValueError:
        return False
    return True


JOB_RULES = (Rule(
    f"self.metadata.name.size() <= {kube.JOB_NAME_MAX_LENGTH} && "
    f"self.metadata.name.matches(r'{kube.DNS_1035_LABEL_PATTERN}')",
    f"metadata.name must be a DNS-1035 label of at most {kube.JOB_NAME_MAX_LENGTH} characters "
    "(lowercase letters, digits and '-', starting with a letter): the job's pods and Services are named after it",
    lambda job: _valid_job_name(job.metadata.name)),)


class RLTrainingJob(_Model):
    model_config = ConfigDict(extra="ignore")
    RULES = JOB_RULES
    api_version: Literal["kuberl.dev/v1alpha1"] = Field(alias="apiVersion", description="kuberl.dev/v1alpha1")
    kind: Literal["RLTrainingJob"] = Field(description="RLTrainingJob")
    metadata: ObjectMeta
    spec: RLTrainingJobSpec
    status: RLTrainingJobStatus = Field(default_factory=RLTrainingJobStatus)

    @model_validator(mode="after")
    def _one_queue_name(self) -> RLTrainingJob:
        label = self.metadata.labels.get(QUEUE_NAME_LABEL)
        if label is not None and self.spec.queue_name is not None and label != self.spec.queue_name:
            raise ValueError(f"spec.queueName {self.spec.queue_name!r} and the job's label {QUEUE_NAME_LABEL} "
                             f"{label!r} differ: set one of them (or both to the same LocalQueue)")
        return self

    @property
    def queue_name(self) -> str | None:
        """The Kueue LocalQueue of the job: spec.queueName, else the job's kueue.x-k8s.io/queue-name label."""
        return self.spec.queue_name or self.metadata.labels.get(QUEUE_NAME_LABEL) or None

    def manifest(self) -> dict[str, Any]:
        """The job as a Kubernetes manifest (camelCase, defaults filled in), without status."""
        return self.model_dump(mode="json", by_alias=True, exclude={"status"})

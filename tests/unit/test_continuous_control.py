"""SAC and TD3 against hand-computed cases: their targets, the squashed Gaussian's density, the entropy
coefficient's step, TD3's smoothing and delay, the numpy actors against their torch twins, a resumed
learner that goes on exactly as the one it was saved from, and the checks on the action space."""

from __future__ import annotations

import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from kuberl.api.job import AlgorithmName, RLTrainingJobSpec, SACConfig, TD3Config
from kuberl.api.semantics import check_spaces, registered_envs
from kuberl.trainer.algorithms.sac import SAC
from kuberl.trainer.algorithms.td3 import TD3
from kuberl.trainer.networks import DeterministicActor, SquashedGaussianActor, numpy_params
from kuberl.trainer.policies import make_policy
from kuberl.trainer.spaces import space_info

CPU = torch.device("cpu")
# A 2-dimensional Box whose halves differ, so a scale or offset mixed up shows.
INFO = space_info(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(np.array([-2.0, 0.0], np.float32),
                                                                       np.array([2.0, 1.0], np.float32)))
SMALL = {"network": {"hiddenSizes": [8, 8], "activation": "relu"}, "batchSize": 4, "learningStarts": 0}


def sac(seed: int = 0, **overrides) -> SAC:
    return SAC(SACConfig.model_validate({**SMALL, **overrides}), INFO, CPU, seed, 1000)


def td3(seed: int = 0, **overrides) -> TD3:
    return TD3(TD3Config.model_validate({**SMALL, **overrides}), INFO, CPU, seed, 1000)


def fill(algo, n: int = 16, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    algo.buffer.add({"obs": rng.normal(size=(n, 3)).astype(np.float32),
                     "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
                     "actions": rng.uniform([-2, 0], [2, 1], size=(n, 2)).astype(np.float32),
                     "rewards": rng.normal(size=n).astype(np.float32),
                     "dones": (rng.random(n) < 0.3).astype(np.float32),
                     "discounts": np.full(n, 0.99, np.float32)})


def one_batch(algo, rewards, dones, discounts) -> None:
    """A replay holding exactly `batchSize` copies of known transitions is sampled whole, whatever the draw."""
    n = len(rewards)
    algo.buffer.add({"obs": np.zeros((n, 3), np.float32), "next_obs": np.ones((n, 3), np.float32),
                     "actions": np.zeros((n, 2), np.float32), "rewards": np.asarray(rewards, np.float32),
                     "dones": np.asarray(dones, np.float32), "discounts": np.asarray(discounts, np.float32)})


def capture_target(algo) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    step = algo.critic_step

    def recording(batch, target):
        seen.append(target.clone())
        return step(batch, target)

    algo.critic_step = recording
    return seen


def test_sac_target_is_reward_plus_discounted_soft_min_of_the_target_qs():
    algo = sac(batchSize=2, autotuneAlpha=False, alpha=0.5)
    one_batch(algo, rewards=[1.0, 2.0], dones=[0.0, 1.0], discounts=[0.9, 0.9])
    # a' and log pi(a'|s') for s' as the stubbed actor gives them, then Q_target_1 and Q_target_2 of (s', a').
    real_sample = algo.actor.sample
    algo.actor.sample = lambda obs, gen: ((torch.zeros(len(obs), 2), torch.full((len(obs),), -1.0))
                                          if bool((obs == 1).all()) else real_sample(obs, gen))
    algo.critic_target.forward = lambda obs, actions: (torch.full((len(obs),), 3.0), torch.full((len(obs),), 4.0))
    targets = capture_target(algo)
    algo.update()
    # y = r + gamma^k (1 - done) (min(3, 4) - 0.5 * -1): 1 + 0.9 * 3.5 = 4.15 and, terminal, 2.
    assert sorted(targets[0].tolist()) == pytest.approx([2.0, 4.15])


def test_squashed_gaussian_density_matches_torch_distributions():
    actor = SquashedGaussianActor(INFO, [8], "relu", CPU)
    obs = torch.randn(64, 3)
    actions, logp = actor.sample(obs, torch.Generator().manual_seed(0))
    mean, log_std = actor(obs)
    scale, bias = actor.scale, actor.bias
    # An independent density: Normal pushed through torch's own tanh and affine transforms.
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()),
        [torch.distributions.TanhTransform(), torch.distributions.AffineTransform(bias, scale)])
    inner = torch.atanh(((actions - bias) / scale).clamp(-1 + 1e-6, 1 - 1e-6))
    reference = dist.base_dist.log_prob(inner) - torch.log(scale * (1 - torch.tanh(inner) ** 2))
    torch.testing.assert_close(logp, reference.sum(1), rtol=1e-3, atol=2e-3)
    assert ((actions >= torch.tensor([-2.0, 0.0])) & (actions <= torch.tensor([2.0, 1.0]))).all()


@pytest.mark.parametrize("log_std, direction", [(0.0, -1.0), (-5.0, 1.0)], ids=["wide", "narrow"])
def test_entropy_coefficient_steps_towards_the_target_entropy(log_std, direction):
    """Adam's first step moves log alpha by exactly its learning rate, down when the policy's entropy
    is above the target (-2 here: tanh(N(0, 1)) on these ranges has about +1.7) and up when below (a
    std of e^-5: about -7.2)."""
    algo = sac(qLearningRate=1e-3)
    fill(algo)
    with torch.no_grad():
        for layer in (algo.actor.mean, algo.actor.log_std):
            layer.weight.zero_()
            layer.bias.zero_()
        # the actor's log std is -5 + 3.5 (tanh(b) + 1): b sets it
        algo.actor.log_std.bias.fill_(math.atanh(min((log_std + 5.0) / 3.5 - 1.0, 0.999999)) if log_std > -5 else -20.0)
    algo.update()
    assert algo.log_alpha.item() == pytest.approx(direction * 1e-3, rel=1e-3)
    assert algo.extra_stats(0)["alpha"] == pytest.approx(math.exp(direction * 1e-3), rel=1e-6)


def test_fixed_alpha_stays_where_it_was_set():
    algo = sac(autotuneAlpha=False, alpha=0.3)
    fill(algo)
    algo.update()
    assert algo.alpha == pytest.approx(0.3)


def test_td3_target_smooths_with_clipped_noise_and_takes_the_min_of_the_target_qs():
    algo = td3(batchSize=2, policyNoise=0.0)
    one_batch(algo, rewards=[1.0, 2.0], dones=[0.0, 1.0], discounts=[0.5, 0.5])
    algo.critic_target.forward = lambda obs, actions: (torch.full((len(obs),), 6.0), torch.full((len(obs),), 4.0))
    targets = capture_target(algo)
    algo.update()
    assert sorted(targets[0].tolist()) == pytest.approx([2.0, 3.0])  # 1 + 0.5 * min(6, 4); terminal: 2

    # Noise far wider than the clip: every smoothed action stays within noiseClip half-ranges of the
    # target actor's, and inside the Box.
    algo = td3(batchSize=256, policyNoise=10.0, noiseClip=0.1)
    fill(algo, 256)
    seen: list[torch.Tensor] = []
    algo.critic_target.forward = lambda obs, actions: (seen.append(actions) or torch.zeros(len(obs)),
                                                       torch.zeros(len(obs)))
    algo.update()
    centre = algo.actor_target(algo.buffer.next_obs[:256]).detach()
    gap = (seen[0].sort(0).values - centre.sort(0).values).abs()  # same multiset up to the clip, per column
    assert (seen[0] >= torch.tensor([-2.0, 0.0])).all() and (seen[0] <= torch.tensor([2.0, 1.0])).all()
    assert gap.max() <= 0.1 * 2.0 + 1e-5  # the widest half-range is 2


def test_td3_moves_its_actor_and_targets_only_every_policy_delay_updates():
    algo = td3(policyDelay=2)
    fill(algo)
    actor0 = [p.clone() for p in algo.actor.parameters()]
    target0 = [p.clone() for p in algo.critic_target.parameters()]
    algo.update()
    assert all(torch.equal(a, b) for a, b in zip(actor0, algo.actor.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(target0, algo.critic_target.parameters(), strict=True))
    algo.update()
    assert not all(torch.equal(a, b) for a, b in zip(actor0, algo.actor.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(target0, algo.critic_target.parameters(), strict=True))


def test_numpy_actors_match_their_torch_twins_and_act_inside_the_box():
    obs = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    for algo in (sac(), td3()):
        policy = make_policy(INFO, algo.policy_config())
        policy.load(algo.weights())
        if isinstance(algo, SAC):
            mean, _ = algo.actor(torch.as_tensor(obs))
            expected = torch.tanh(mean) * algo.actor.scale + algo.actor.bias
        else:
            expected = algo.actor(torch.as_tensor(obs))
        np.testing.assert_allclose(policy.greedy(obs, None), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
        for epsilon in (0.0, 0.5, 1.0):
            actions = policy.act(np.random.default_rng(1), obs, None, epsilon)
            assert actions.shape == (32, 2) and (actions >= low).all() and (actions <= high).all()
        uniform = policy.act(np.random.default_rng(2), np.zeros((4000, 3), np.float32), None, 1.0)
        np.testing.assert_allclose(uniform.mean(0), (low + high) / 2, atol=0.05)  # the warm-up is uniform


def test_deterministic_actor_names_match_the_numpy_policy():
    actor = DeterministicActor(INFO, [8, 8], "relu", CPU)
    assert sorted(numpy_params(actor)) == [f"mu.{i}.{p}" for i in range(3) for p in ("bias", "weight")]


@pytest.mark.parametrize("make", [sac, td3], ids=["SAC", "TD3"])
def test_a_resumed_learner_goes_on_exactly_as_the_one_it_was_saved_from(make):
    """Networks, targets, optimizers, the entropy coefficient, the replay and its sampler all come back
    through the checkpoint's own load (weights_only)."""
    first = make(seed=0)
    fill(first, 64)
    for _ in range(3):
        first.update()
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    saved.seek(0)
    resumed = make(seed=99)
    resumed.load_state_dict(torch.load(saved, weights_only=True))
    for _ in range(3):
        assert resumed.update() == first.update()
    for a, b in zip(first.state_dict()["actor"].values(), resumed.state_dict()["actor"].values(), strict=True):
        assert torch.equal(a, b)
    assert resumed.buffer.size == first.buffer.size == 64
    assert resumed.gradient_updates == first.gradient_updates == 6


def test_the_warm_up_is_random_until_learning_starts_and_updates_wait_for_it():
    algo = sac(learningStarts=100)
    assert algo.exploration(99) == 1.0 and algo.exploration(100) == 0.0
    fill(algo, 50)
    assert algo.updates_due(50, 50) == 0
    assert algo.updates_due(10, 110) == 10  # trainFrequency 1, gradientSteps 1: one update per env step


def test_an_unbounded_or_discrete_action_space_is_refused_by_name():
    unbounded = space_info(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-np.inf, np.inf, (2,)))
    with pytest.raises(ValueError, match=r"spec\.algorithm\.name: SAC needs a Box action space with finite bounds"):
        SAC(SACConfig(), unbounded, CPU, 0, 100)
    discrete = space_info(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match=r"spec\.algorithm\.name: TD3 acts in Box .*can: PPO, DQN, BDQ, QLearning$"):
        TD3(TD3Config(), discrete, CPU, 0, 100)


def test_validate_names_the_algorithms_that_fit_the_action_space(job_dict):
    table = registered_envs()

    def problems(algorithm: str, env_id: str):
        job_dict["spec"]["algorithm"]["name"], job_dict["spec"]["environment"]["id"] = algorithm, env_id
        spec = RLTrainingJobSpec.model_validate(job_dict["spec"])
        return check_spaces(spec, table[env_id].action, table[env_id].observation)

    for algorithm, env_id, fits in ((AlgorithmName.DQN, "Pendulum-v1", "PPO, SAC, TD3"),
                                    (AlgorithmName.SAC, "CartPole-v1", "PPO, DQN, BDQ, QLearning")):
        (problem,) = problems(algorithm.value, env_id)
        assert problem.path == "spec.algorithm.name"
        assert problem.message.endswith(f"choose one that can: {fits}")
    assert problems("SAC", "Pendulum-v1") == problems("TD3", "Pendulum-v1") == []

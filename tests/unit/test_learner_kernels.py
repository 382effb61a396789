"""The learner's own kernels against torch's: FusedAdam against torch.optim.Adam(fused=True) (the same
updates bit for bit, the same state_dict format both ways, and a learner that never imports
torch._dynamo), the numpy-forward Tanh against torch.tanh, and the categorical log-prob and entropy
against torch.distributions.Categorical."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from kuberl.trainer.networks import Tanh, categorical_logp_entropy
from kuberl.trainer.optim import FusedAdam


def _nets(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    b = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _step(net: torch.nn.Module, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()


@pytest.mark.parametrize("kwargs", [{"lr": 3e-3}, {"lr": 1e-2, "eps": 1e-5, "weight_decay": 0.01},
                                    {"lr": 5e-4, "betas": (0.8, 0.95)}])
def test_same_updates_as_torch_fused_adam(kwargs):
    ours_net, ref_net = _nets()
    ours, ref = FusedAdam(ours_net.parameters(), **kwargs), torch.optim.Adam(ref_net.parameters(), fused=True, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for t in range(25):
        x, y = torch.randn(32, 5, generator=gen), torch.randn(32, 3, generator=gen)
        if t == 10:  # an annealed learning rate, set the way PPO sets it
            ours.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = kwargs["lr"] / 3
        _step(ours_net, ours, x, y)
        _step(ref_net, ref, x, y)
        for p, q in zip(ours_net.parameters(), ref_net.parameters()):
            assert torch.equal(p, q), f"step {t}"
    assert not torch.equal(next(ours_net.parameters()), _nets()[0].state_dict()["0.weight"])  # it did train


def test_a_parameter_without_gradient_is_left_alone_and_has_no_state():
    net, ref_net = _nets()
    frozen_before = net[2].bias.detach().clone()
    net[2].bias.requires_grad_(False)
    ref_net[2].bias.requires_grad_(False)
    ours, ref = FusedAdam(net.parameters(), lr=1e-2), torch.optim.Adam(ref_net.parameters(), lr=1e-2, fused=True)
    x, y = torch.randn(8, 5), torch.randn(8, 3)
    _step(net, ours, x, y)
    _step(ref_net, ref, x, y)
    assert torch.equal(net[2].bias, frozen_before)
    assert sorted(ours.state_dict()["state"]) == sorted(ref.state_dict()["state"]) == [0, 1, 2]


def test_state_dict_has_torch_adams_format_and_loads_both_ways():
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 5, generator=gen), torch.randn(16, 3, generator=gen)) for _ in range(12)]
    ours_net, ref_net = _nets()
    ours = FusedAdam(ours_net.parameters(), lr=2e-3, eps=1e-5)
    ref = torch.optim.Adam(ref_net.parameters(), lr=2e-3, eps=1e-5, fused=True)
    for x, y in batches[:6]:
        _step(ours_net, ours, x, y)
        _step(ref_net, ref, x, y)
    mine, theirs = ours.state_dict(), ref.state_dict()
    assert mine["param_groups"][0].keys() == theirs["param_groups"][0].keys()
    assert mine["param_groups"][0] == theirs["param_groups"][0]
    assert mine["state"].keys() == theirs["state"].keys()
    for key in theirs["state"]:
        assert mine["state"][key].keys() == theirs["state"][key].keys()
        for name, value in theirs["state"][key].items():
            assert mine["state"][key][name].dtype == value.dtype
            assert torch.equal(mine["state"][key][name], value), (key, name)

    # A checkpoint written by torch.optim.Adam continues in FusedAdam, and the other way round.
    net_a, net_b = _nets()
    net_a.load_state_dict(ref_net.state_dict())
    net_b.load_state_dict(ref_net.state_dict())
    from_torch = FusedAdam(net_a.parameters(), lr=99.0)
    from_torch.load_state_dict(theirs)
    assert from_torch.param_groups[0]["lr"] == 2e-3 and from_torch.param_groups[0]["eps"] == 1e-5
    into_torch = torch.optim.Adam(net_b.parameters(), lr=99.0, fused=True)
    into_torch.load_state_dict(mine)
    for x, y in batches[6:]:
        _step(ref_net, ref, x, y)
        _step(net_a, from_torch, x, y)
        _step(net_b, into_torch, x, y)
    for p, q, r in zip(ref_net.parameters(), net_a.parameters(), net_b.parameters()):
        assert torch.equal(p, q) and torch.equal(p, r)


def test_load_state_dict_rejects_another_models_state():
    net, _ = _nets()
    opt = FusedAdam(net.parameters())
    other = torch.nn.Linear(5, 3)
    other_opt = torch.optim.Adam(other.parameters(), fused=True)
    other(torch.randn(2, 5)).sum().backward()
    other_opt.step()
    with pytest.raises(ValueError, match="parameters"):
        opt.load_state_dict(other_opt.state_dict())
    with pytest.raises(ValueError, match="empty"):
        FusedAdam([])


def test_the_learner_never_imports_torch_dynamo():
    """torch.optim imports torch._dynamo on first use (~1 s of CPU on the critical path of every run)."""
    code = textwrap.dedent("""
        import io
        import sys

        import gymnasium as gym
        import numpy as np
        import torch

        from kuberl.api.job import RLTrainingJob
        from kuberl.trainer.algorithms import algorithm_for
        from kuberl.trainer.spaces import space_info

        env = gym.make("CartPole-v1")
        info = space_info(env.observation_space, env.action_space)

        def build(name):
            job = RLTrainingJob.model_validate({"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLTrainingJob",
                "metadata": {"name": "t"}, "spec": {"algorithm": {"name": name}, "environment": {"id": "CartPole-v1"},
                                                    "stopping": {"maxEnvSteps": 10000}}})
            return algorithm_for(job.spec, info, torch.device("cpu"), 0, 10_000)

        for name in ("PPO", "DQN"):
            algo = build(name)
            algo.load_state_dict(algo.state_dict())
            torch.save(algo.state_dict(), io.BytesIO())
        rng = np.random.default_rng(0)
        T, N = 32, 4
        batch = {"obs": rng.standard_normal((T, N, 4)).astype(np.float32), "actions": rng.integers(0, 2, (T, N)),
                 "logprobs": np.full((T, N), -0.69, np.float32), "rewards": np.ones((T, N), np.float32),
                 "values": np.zeros((T, N), np.float32), "dones": np.zeros((T, N), np.float32),
                 "last_values": np.zeros(N, np.float32)}
        assert build("PPO").learn([batch], 128).gradient_updates > 0
        print("torch._dynamo" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_tanh_matches_torch_forward_and_backward():
    gen = torch.Generator().manual_seed(3)
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-14)):
        x = (torch.randn(64, 33, generator=gen, dtype=dtype) * 3).requires_grad_(True)
        x_ref = x.detach().clone().requires_grad_(True)
        y, y_ref = Tanh()(x), torch.tanh(x_ref)
        assert y.dtype == dtype and y.shape == x.shape
        torch.testing.assert_close(y, y_ref, atol=tol, rtol=0)
        upstream = torch.randn(64, 33, generator=gen, dtype=dtype)
        y.backward(upstream)
        y_ref.backward(upstream)
        torch.testing.assert_close(x.grad, x_ref.grad, atol=10 * tol, rtol=0)
    xd = torch.randn(6, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(Tanh(), (xd,))
    # a non-contiguous input (a column slice) and no-grad inference
    wide = torch.randn(8, 10, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(Tanh()(wide[:, ::3]), torch.tanh(wide[:, ::3]), atol=1e-6, rtol=0)
    # traced graphs (TorchScript, ONNX) get torch's op, which they can serialise
    traced = torch.jit.trace(Tanh(), torch.randn(2, 3))
    assert "aten::tanh" in str(traced.graph)


@pytest.mark.parametrize("masked", [False, True])
def test_categorical_logp_entropy_matches_torch_distributions(masked):
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(300, 7, generator=gen, dtype=torch.float64) * 4
    if masked:  # the way ActorCritic masks illegal actions; every row keeps at least one
        mask = torch.rand(300, 7, generator=gen) < 0.6
        mask[:, 0] = True
        logits = logits.masked_fill(~mask, -1e9)
    actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)
    logits.requires_grad_(True)
    logp, entropy = categorical_logp_entropy(logits, actions)
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    (logp.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()

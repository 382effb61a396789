"""PyTorch networks the learner trains: PPO's actor-critic, DQN's Q-network, BDQ's branching
Q-network, and the actors and twin Q-networks of SAC and TD3. Parameter names match their numpy
twins in `policies/` exactly."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from kuberl.trainer.policies.continuous import LOG_STD_MAX, LOG_STD_MIN
from kuberl.trainer.spaces import SpaceInfo


def _layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class _NumpyTanh(torch.autograd.Function):
    """tanh with numpy's forward pass: torch 2.x's CPU tanh takes ~40 us for a 256x64 float32 batch
    here, numpy's ~3 us (and the rollout workers' numpy policies use numpy's, so the learner
    computes the very activations they act on). The backward pass is torch's own tanh_backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Module):
    """nn.Tanh, computed by numpy on the CPU for float32/float64 (see `_NumpyTanh`), else by torch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not torch.jit.is_tracing():
            return _NumpyTanh.apply(x)
        return torch.tanh(x)


def _activation(name: str) -> nn.Module:
    return Tanh() if name == "tanh" else nn.ReLU()


def categorical_logp_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of `actions` and entropy of the categorical distribution over the last axis:
    what torch.distributions.Categorical(logits=...) gives, in four ops instead of about fifteen."""
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy


class MLP(nn.Module):
    """Linear layers named `0..n-1` with the activation between (and after the last when final_act)."""

    def __init__(self, sizes: list[int], activation: str, final_act: bool = False, last_std: float | None = None,
                 orthogonal: bool = True):
        super().__init__()
        self.layers = nn.ModuleList()
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
            std = last_std if (last_std is not None and i == len(sizes) - 2) else float(np.sqrt(2))
            # orthogonal=False keeps torch's default init, what SAC's and TD3's published code uses
            self.layers.append(_layer_init(nn.Linear(a, b), std) if orthogonal else nn.Linear(a, b))
        self.act = _activation(activation)
        self.final_act = final_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1 or self.final_act:
                x = self.act(x)
        return x


def numpy_params(module: nn.Module) -> dict[str, np.ndarray]:
    """State dict as numpy arrays on the CPU with the `layers.` infix dropped (the numpy naming)."""
    return {
        name.replace(".layers.", "."): t.detach().to("cpu", copy=True).numpy()
        for name, t in module.state_dict().items()
    }


class ActorCritic(nn.Module):
    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str):
        super().__init__()
        self.info = info
        if info.action_kind == "Box":
            n_out = int(np.prod(info.action_dims))
            self.log_std = nn.Parameter(torch.zeros(n_out))
        else:
            n_out = int(sum(info.action_dims))
        self.actor = MLP([info.obs_dim, *hidden, n_out], activation, last_std=0.01)
        self.critic = MLP([info.obs_dim, *hidden, 1], activation, last_std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None = None):
        """Log-prob of `actions`, entropy, and value: what PPO's loss needs."""
        out = self.actor(obs)
        kind = self.info.action_kind
        if kind == "Discrete":
            if mask is not None:
                out = out.masked_fill(~mask.bool(), -1e9)
            logp, entropy = categorical_logp_entropy(out, actions)
            return logp, entropy, self.value(obs)
        if kind == "MultiDiscrete":
            logps, ents, start = 0.0, 0.0, 0
            for j, n in enumerate(self.info.action_dims):
                logp, entropy = categorical_logp_entropy(out[:, start : start + n], actions[:, j])
                logps = logps + logp
                ents = ents + entropy
                start += n
            return logps, ents, self.value(obs)
        std = self.log_std.exp().expand_as(out)
        dist = torch.distributions.Normal(out, std)
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1), self.value(obs)


class QNetwork(nn.Module):
    """Q(s, .) for discrete actions; a dueling head computes V(s) + A(s,a) - mean_a A(s,a)."""

    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str, dueling: bool):
        super().__init__()
        self.dueling = dueling
        n = info.action_dims[0]
        self.trunk = MLP([info.obs_dim, *hidden], activation, final_act=True)
        if dueling:
            self.value = _layer_init(nn.Linear(hidden[-1], 1), 1.0)
            self.advantage = _layer_init(nn.Linear(hidden[-1], n), 1.0)
        else:
            self.q = _layer_init(nn.Linear(hidden[-1], n), 1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.trunk(obs)
        if not self.dueling:
            return self.q(h)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)


# ---- SAC and TD3: continuous actions in a bounded Box -----------------------------------------------



def action_scale_bias(info: SpaceInfo, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Half the action range and its middle: tanh's [-1, 1] mapped onto the Box."""
    low = torch.tensor(info.action_low, dtype=torch.float32, device=device)
    high = torch.tensor(info.action_high, dtype=torch.float32, device=device)
    return (high - low) / 2.0, (high + low) / 2.0


class TwinQ(nn.Module):
    """Two independent Q(s, a) MLPs on the observation and action side by side (clipped double Q)."""

    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str):
        super().__init__()
        sizes = [info.obs_dim + int(np.prod(info.action_dims)), *hidden, 1]
        self.q1 = MLP(sizes, activation, orthogonal=False)
        self.q2 = MLP(sizes, activation, orthogonal=False)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, actions], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)

    def first(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q_1 alone: what TD3's actor climbs (computing Q_2 there too was a critic's forward pass wasted)."""
        return self.q1(torch.cat([obs, actions], dim=1)).squeeze(1)


class SquashedGaussianActor(nn.Module):
    """SAC's actor: a Gaussian over pre-tanh actions, tanh-squashed and scaled onto the Box."""

    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str, device: torch.device):
        super().__init__()
        n = int(np.prod(info.action_dims))
        self.trunk = MLP([info.obs_dim, *hidden], activation, final_act=True, orthogonal=False)
        self.mean = nn.Linear(hidden[-1], n)
        self.log_std = nn.Linear(hidden[-1], n)
        self.scale, self.bias = action_scale_bias(info, device)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        log_std = torch.tanh(self.log_std(h))
        return self.mean(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1.0)

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action in the Box and its log-density there (the tanh and the scaling's
        Jacobians included: log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), exact where tanh
        saturates)."""
        mean, log_std = self(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        u = mean + log_std.exp() * noise
        gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * float(np.log(2 * np.pi))
        squash = 2.0 * (float(np.log(2.0)) - u - nn.functional.softplus(-2.0 * u))
        logp = (gaussian - squash - torch.log(self.scale)).sum(1)
        return torch.tanh(u) * self.scale + self.bias, logp


class DeterministicActor(nn.Module):
    """TD3's actor: tanh of an MLP, scaled onto the Box."""

    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str, device: torch.device):
        super().__init__()
        self.mu = MLP([info.obs_dim, *hidden, int(np.prod(info.action_dims))], activation, orthogonal=False)
        self.scale, self.bias = action_scale_bias(info, device)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mu(obs)) * self.scale + self.bias


# ---- BDQ: the Branching Dueling Q-Network (Tavakoli et al., 2018) ---------------------------------
#
#     obs -> [per-part encoders, concatenated] -> shared trunk -> value head V(s)         (2 layers)
#                                                              -> advantage branch d: A_d(s, .)  (2 layers)
#     Q_d(s, a_d) = V(s) + A_d(s, a_d) - mean_a A_d(s, a)
#
# A Dict observation (AutoscalingMulti-v0's "macro" and "micro") gets one encoder per part, so fast
# local signals are not drowned by the platform-wide ones before they meet.


def branch_sizes(info: SpaceInfo) -> tuple[int, ...]:
    """Actions per branch: a MultiDiscrete's nvec, or one branch for a Discrete space."""
    if info.action_kind not in ("Discrete", "MultiDiscrete"):
        raise ValueError(f"BDQ acts in Discrete or MultiDiscrete action spaces, got {info.action_kind}")
    return tuple(info.action_dims)


def encoded_parts(info: SpaceInfo) -> tuple[tuple[str, int], ...]:
    """The observation parts that get their own encoder: every part of a Dict with more than one."""
    return info.obs_parts if len(info.obs_parts) > 1 else ()


def trunk_width(info: SpaceInfo, hidden: list[int]) -> int:
    """Width of BranchingQNetwork.features: the trunk's last layer (the encoders' concatenation when
    the trunk is that alone)."""
    parts = encoded_parts(info)
    return hidden[0] * len(parts) if parts and len(hidden) == 1 else hidden[-1]


class BranchHeads(nn.Module):
    """The value head and every advantage branch, each a 2-layer MLP, computed as two batched layers:
    one Linear to all their hidden units, then each head's own output weights in one einsum (fewer,
    larger ops: a CPU learner's update is ~25% faster than with one module per head). Outputs are
    padded to the widest branch; padding never reaches a Q value, so its weights get no gradient."""

    def __init__(self, width: int, branch_hidden: int, sizes: tuple[int, ...], activation: str):
        super().__init__()
        self.sizes, self.branch_hidden = sizes, branch_hidden
        heads = (1, *sizes)  # the value head first
        self.hidden = _layer_init(nn.Linear(width, len(heads) * branch_hidden))
        self.act = _activation(activation)
        out_weight = torch.zeros(len(heads), branch_hidden, max(heads))
        for k, n in enumerate(heads):
            block = torch.empty(n, branch_hidden)
            nn.init.orthogonal_(block, 1.0)
            out_weight[k, :, :n] = block.T
        self.out_weight = nn.Parameter(out_weight)
        self.out_bias = nn.Parameter(torch.zeros(len(heads), max(heads)))

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        # -1: exported graphs keep a free batch dimension
        z = self.act(self.hidden(h)).view(-1, len(self.sizes) + 1, self.branch_hidden)
        out = torch.einsum("bkh,khn->bkn", z, self.out_weight) + self.out_bias
        value = out[:, 0, :1]
        advantages = [out[:, d + 1, :n] for d, n in enumerate(self.sizes)]
        return [value + adv - adv.mean(dim=1, keepdim=True) for adv in advantages]


class BranchingQNetwork(nn.Module):
    """Per-branch Q values, a list of [batch, n_d] tensors (branches may differ in size)."""

    def __init__(self, info: SpaceInfo, hidden: list[int], activation: str, branch_hidden: int):
        super().__init__()
        self.parts = encoded_parts(info)
        if self.parts:
            # The first hidden width is each encoder's; the trunk continues from their concatenation.
            self.encoders = nn.ModuleDict(
                {key: MLP([width, hidden[0]], activation, final_act=True) for key, width in self.parts}
            )
            trunk_sizes = [hidden[0] * len(self.parts), *hidden[1:]]
        else:
            trunk_sizes = [info.obs_dim, *hidden]
        self.trunk = MLP(trunk_sizes, activation, final_act=True)
        self.heads = BranchHeads(trunk_sizes[-1], branch_hidden, branch_sizes(info), activation)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.parts:
            pieces, start = [], 0
            for key, width in self.parts:
                pieces.append(self.encoders[key](obs[:, start : start + width]))
                start += width
            obs = torch.cat(pieces, dim=1)
        return self.trunk(obs)

    def forward(self, obs: torch.Tensor) -> list[torch.Tensor]:
        return self.heads(self.features(obs))

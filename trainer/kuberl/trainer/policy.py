"""Acting policies in numpy: what a rollout worker runs, one batched forward pass per env step.

The learner owns torch networks (`networks.py`) and ships their weights as numpy arrays once per
iteration; these classes run the same math without torch, so workers stay small and fast. A test
checks every policy here against its torch twin.
"""

from __future__ import annotations

import numpy as np

from kuberl.trainer.spaces import SpaceInfo

Params = dict[str, np.ndarray]


def mlp(params: Params, prefix: str, x: np.ndarray, n_layers: int, activation: str, final_act: bool = False) -> np.ndarray:
    """Apply `{prefix}.{i}.weight/bias` linear layers with the activation between them."""
    act = np.tanh if activation == "tanh" else (lambda v: np.maximum(v, 0.0))
    for i in range(n_layers):
        x = x @ params[f"{prefix}.{i}.weight"].T + params[f"{prefix}.{i}.bias"]
        if i < n_layers - 1 or final_act:
            x = act(x)
    return x


def masked_argmax(values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is not None:
        values = np.where(mask.astype(bool), values, -np.inf)
    return values.argmax(axis=-1)


def random_legal(rng: np.random.Generator, n_actions: int, batch: int, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return rng.integers(0, n_actions, size=batch)
    # Gumbel trick over legal actions: uniform among the legal ones, vectorised.
    noise = rng.random((batch, n_actions))
    return masked_argmax(noise, mask)


def sample_categorical(rng: np.random.Generator, logits: np.ndarray, mask: np.ndarray | None):
    """Sample from softmax(logits) (illegal actions get probability 0); returns (actions, log_probs)."""
    if mask is not None:
        logits = np.where(mask.astype(bool), logits, -1e9)
    logits = logits - logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    log_p = logits - log_z
    gumbel = -np.log(-np.log(rng.random(logits.shape) + 1e-20) + 1e-20)
    actions = (log_p + gumbel).argmax(axis=-1)
    return actions, np.take_along_axis(log_p, actions[:, None], axis=-1)[:, 0]


class ActorCriticPolicy:
    """PPO's policy: an actor MLP producing logits (or a Gaussian mean) and a critic MLP."""

    kind = "ppo"

    def __init__(self, info: SpaceInfo, n_layers: int, activation: str):
        self.info = info
        self.n_layers = n_layers
        self.activation = activation
        self.params: Params = {}

    def load(self, params: Params) -> None:
        self.params = params

    def value(self, obs: np.ndarray) -> np.ndarray:
        return mlp(self.params, "critic", obs, self.n_layers + 1, self.activation)[:, 0]

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, deterministic: bool = False):
        """Returns (actions, log_probs, values)."""
        out = mlp(self.params, "actor", obs, self.n_layers + 1, self.activation)
        value = self.value(obs)
        kind = self.info.action_kind
        if kind == "Discrete":
            if deterministic:
                return masked_argmax(out, mask), np.zeros(len(obs), np.float32), value
            actions, logp = sample_categorical(rng, out, mask)
            return actions, logp, value
        if kind == "MultiDiscrete":
            actions, logps, start = [], np.zeros(len(obs)), 0
            for n in self.info.action_dims:
                logits = out[:, start : start + n]
                if deterministic:
                    actions.append(logits.argmax(axis=-1))
                else:
                    a, lp = sample_categorical(rng, logits, None)
                    actions.append(a)
                    logps = logps + lp
                start += n
            return np.stack(actions, axis=1), logps, value
        # Box: diagonal Gaussian with a state-independent log std.
        log_std = self.params["log_std"]
        if deterministic:
            return out, np.zeros(len(obs)), value
        std = np.exp(log_std)
        noise = rng.standard_normal(out.shape)
        actions = out + std * noise
        logp = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(axis=-1)
        return actions, logp, value


class QPolicy:
    """Epsilon-greedy over a Q-network (plain or dueling) for DQN; masked when the env gives masks."""

    kind = "dqn"

    def __init__(self, info: SpaceInfo, n_layers: int, activation: str, dueling: bool):
        self.info = info
        self.n_layers = n_layers
        self.activation = activation
        self.dueling = dueling
        self.params: Params = {}

    def load(self, params: Params) -> None:
        self.params = params

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        h = mlp(self.params, "trunk", obs, self.n_layers, self.activation, final_act=True)
        if not self.dueling:
            return h @ self.params["q.weight"].T + self.params["q.bias"]
        value = h @ self.params["value.weight"].T + self.params["value.bias"]
        adv = h @ self.params["advantage.weight"].T + self.params["advantage.bias"]
        return value + adv - adv.mean(axis=-1, keepdims=True)

    def act(self, rng: np.random.Generator, obs: np.ndarray, mask: np.ndarray | None, epsilon: float = 0.0):
        greedy = masked_argmax(self.q_values(obs), mask)
        if epsilon <= 0.0:
            return greedy
        explore = rng.random(len(obs)) < epsilon
        if not explore.any():
            return greedy
        random_actions = random_legal(rng, self.info.action_dims[0], len(obs), mask)
        return np.where(explore, random_actions, greedy)

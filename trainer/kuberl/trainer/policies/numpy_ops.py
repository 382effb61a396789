"""The numpy building blocks of every acting policy: MLP layers by parameter name, masked argmax,
uniform legal actions, categorical sampling."""

from __future__ import annotations

import numpy as np

Params = dict[str, np.ndarray]


def mlp(params: Params, prefix: str, x: np.ndarray, n_layers: int, activation: str,
        final_act: bool = False) -> np.ndarray:
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

"""Self-play for two-player envs: each rollout worker plays against a frozen copy of its own policy.

An env opts in by offering `set_opponent_policy(policy)` and asking for it: Tic-Tac-Toe in its kwargs
(`opponent: self` or `mix`), a PettingZoo env under `environment.multiAgent.policies: selfPlay` by its
`self_play_refresh_updates` (kuberl.trainer.envs.selfplay_agents). The worker then keeps one
`FrozenOpponent` — a greedy, masked numpy copy of its acting policy — installed in every env copy,
and replaces the copy once the learner's weights are that many gradient updates newer (0: on every
weights change). The numpy-batched env asks it once per step for all its games (`FrozenOpponent.batch`,
one forward pass); a per-env env once per opponent move, so those answers are cached per position
until the next refresh. Numpy, no torch.
"""

from __future__ import annotations

import copy

import numpy as np

#: Positions remembered per frozen copy; Tic-Tac-Toe has 5,478, so the cache never fills there.
CACHE_LIMIT = 200_000


class FrozenOpponent:
    """`opponent(obs, mask) -> action`: greedy play by a snapshot of a worker's policy.

    `version` is the weights version (gradient updates) the snapshot was taken at; None before
    the first one, when the env plays its fallback (uniform random) instead.
    """

    def __init__(self) -> None:
        self.policy = None
        self.version: int | None = None
        self.calls = 0
        self._cache: dict[bytes, int] = {}

    def refresh(self, policy, version: int) -> None:
        self.policy = copy.deepcopy(policy)  # the worker's policy keeps learning; this copy must not
        self.version = version
        self._cache.clear()

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> int:
        self.calls += 1
        mask = np.asarray(mask, dtype=bool)
        key = obs.tobytes() + mask.tobytes()
        action = self._cache.get(key)
        if action is None:
            action = int(self.policy.greedy(obs[None].astype(np.float32), mask[None])[0])
            if len(self._cache) < CACHE_LIMIT:
                self._cache[key] = action
        return action

    def batch(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Greedy actions for a batch of positions (M, obs) with masks (M, A), one forward pass (a
        numpy-batched env asks for all its games at once)."""
        self.calls += len(obs)
        return self.policy.greedy(np.asarray(obs, np.float32), np.asarray(mask, bool))


def self_play_settings(env) -> tuple[bool, int]:
    """(whether the env asks for a self-play opponent, refresh interval in gradient updates)."""
    refresh = getattr(env, "self_play_refresh_updates", None)  # a PettingZoo env under policies: selfPlay
    if refresh is not None:
        return True, int(refresh)
    base = env.unwrapped
    config = getattr(base, "config", None)
    if not hasattr(base, "set_opponent_policy") or config is None:
        return False, 0
    wanted = getattr(config, "opponent", None) in ("self", "mix")
    return wanted, int(getattr(config, "opponent_refresh_updates", 0))


def attach_self_play(worker) -> FrozenOpponent | None:
    """Give `worker` (a RolloutWorker) a frozen opponent when its envs ask for one.

    A hook the worker runs after each weights change takes the snapshot; the first one installs
    it in every env copy. Until then (episodes begun before any weights arrived) the env plays its
    fallback, uniform random, and says so in `info["opponent_fallback"]`.
    """
    # A numpy-batched env takes one opponent for all its games; a SyncVectorEnv, one per copy.
    envs = [worker.env] if hasattr(worker.env, "set_opponent_policy") else \
        [env.unwrapped for env in getattr(worker.env, "envs", [])]
    if not envs:
        return None
    wanted, refresh_updates = self_play_settings(envs[0])
    if not wanted:
        return None
    opponent = FrozenOpponent()

    def refresh(w) -> None:
        if opponent.version is None:
            opponent.refresh(w.policy, w.weights_version)
            for env in envs:
                env.set_opponent_policy(opponent)
        elif w.weights_version - opponent.version >= refresh_updates:
            opponent.refresh(w.policy, w.weights_version)

    worker.self_play_opponent = opponent
    worker.hooks.append(refresh)
    return opponent

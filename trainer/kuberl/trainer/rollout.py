"""Rollout workers: step a gymnasium vector env with batched numpy inference and return numpy batches.

`RolloutWorker` is plain Python (tests run it without Ray); `ray_worker.py` wraps it as an actor.
It imports numpy and gymnasium only: workers never load torch.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np

from kuberl.trainer.policy import ActorCriticPolicy, QPolicy
from kuberl.trainer.selfplay import attach_self_play
from kuberl.trainer.spaces import flatten_obs, space_info


def make_env(env_id: str, kwargs: dict[str, Any], max_episode_steps: int | None = None) -> gym.Env:
    """One environment from a gymnasium id, a KubeRL id or `module:Class`."""
    from kuberl.api.semantics import resolve_env_factory

    env = resolve_env_factory(env_id)(**kwargs)
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)
    return env


def make_vector_env(env_id: str, kwargs: dict[str, Any], num_envs: int, max_episode_steps: int | None = None,
                    batched: bool = True):
    """`num_envs` copies stepped together: a numpy-batched implementation where KubeRL has one
    (`envs/batched.py`; same episodes as the per-env reference), else gymnasium's SyncVectorEnv."""
    if batched:
        from kuberl.trainer.envs.batched import make_batched

        env = make_batched(env_id, kwargs, num_envs, max_episode_steps)
        if env is not None:
            return env
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(env_id, kwargs, max_episode_steps) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


#: Evaluation episodes stepped side by side in one vector env.
EVAL_CHUNK = 256


def _masks(info: dict, n_envs: int, n_actions: int) -> np.ndarray | None:
    mask = info.get("action_mask")
    if mask is None:
        return None
    return np.asarray(mask, dtype=bool).reshape(n_envs, n_actions)


class RolloutWorker:
    """Owns `num_envs` copies of one environment and the acting half of the policy."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], num_envs: int, seed: int,
                 policy: dict[str, Any], max_episode_steps: int | None = None, worker_index: int = 0):
        self.worker_index = worker_index
        self.env = make_vector_env(env_id, env_kwargs, num_envs, max_episode_steps)
        self.env_id, self.env_kwargs, self.max_episode_steps = env_id, env_kwargs, max_episode_steps
        self.num_envs = num_envs
        self.single_obs_space = self.env.single_observation_space
        self.info = space_info(self.single_obs_space, self.env.single_action_space)
        self.rng = np.random.default_rng([seed, worker_index, 7])
        self.policy = self._make_policy(policy)
        self.weights_version = -1
        raw_obs, info = self.env.reset(seed=[seed * 10_007 + worker_index * 1_000 + i for i in range(num_envs)])
        self.obs = flatten_obs(self.single_obs_space, raw_obs, num_envs)
        n_act = self.info.action_dims[0] if self.info.action_kind == "Discrete" else 0
        self.mask = _masks(info, num_envs, n_act) if n_act else None
        self.episode_return = np.zeros(num_envs)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.env_steps = 0
        self._nstep: _NStepAccumulator | None = None
        self.node = _ray_node_id()
        self._last_end: float | None = None  # end of the previous sample call: the gap is time spent waiting
        self.hooks: list = []  # callables(worker) run after weights change (e.g. self-play opponent refresh)
        self.self_play_opponent = attach_self_play(self)  # None unless a two-player env asks for self-play

    def _make_policy(self, cfg: dict[str, Any]):
        kind = cfg["kind"]
        if kind == "ppo":
            return ActorCriticPolicy(self.info, cfg["n_layers"], cfg["activation"])
        if kind == "dqn":
            return QPolicy(self.info, cfg["n_layers"], cfg["activation"], cfg["dueling"])
        from kuberl.trainer.policy_registry import make_policy  # extension point (BDQ, tabular, ...)

        return make_policy(self.info, cfg, self.single_obs_space)

    # ---- weights ---------------------------------------------------------------------------------

    def set_weights(self, params: dict[str, np.ndarray], version: int) -> None:
        if version != self.weights_version:
            self.policy.load(params)
            self.weights_version = version
            for hook in self.hooks:
                hook(self)

    def _idle(self) -> float:
        return 0.0 if self._last_end is None else time.perf_counter() - self._last_end

    def pid(self) -> int:
        return os.getpid()

    def run(self, fn, *args: Any) -> Any:
        """`fn(self, *args)` here: scenario code that needs this worker's policy (evaluation games)."""
        return fn(self, *args)

    def ping(self) -> int:
        return self.worker_index

    # ---- on-policy (PPO) ------------------------------------------------------------------------

    def sample_onpolicy(self, params, version: int, num_steps: int, gamma: float) -> dict[str, Any]:
        """Collect `num_steps` steps of every env with the stochastic policy; rewards of truncated
        episodes get gamma * V(final obs) folded in so time limits are not treated as terminal."""
        idle = self._idle()
        self.set_weights(params, version)
        n, d = self.num_envs, self.info.obs_dim
        obs_buf = np.empty((num_steps, n, d), np.float32)
        act_shape = () if self.info.action_kind == "Discrete" else (len(self.info.action_dims),) \
            if self.info.action_kind == "MultiDiscrete" else (int(np.prod(self.info.action_dims)),)
        act_dtype = np.float32 if self.info.action_kind == "Box" else np.int64
        actions_buf = np.empty((num_steps, n, *act_shape), act_dtype)
        logp_buf = np.empty((num_steps, n), np.float32)
        value_buf = np.empty((num_steps, n), np.float32)
        reward_buf = np.empty((num_steps, n), np.float32)
        done_buf = np.empty((num_steps, n), np.float32)
        mask_buf = np.empty((num_steps, n, self.info.action_dims[0]), bool) if self.mask is not None else None
        returns, lengths = [], []
        t0 = time.perf_counter()
        for t in range(num_steps):
            obs_buf[t] = self.obs
            if mask_buf is not None:
                mask_buf[t] = self.mask
            actions, logp, value = self.policy.act(self.rng, self.obs, self.mask)
            actions_buf[t] = actions
            logp_buf[t] = logp
            value_buf[t] = value
            env_actions = self._env_actions(actions)
            raw_obs, reward, terminated, truncated, info = self.env.step(env_actions)
            reward = np.asarray(reward, dtype=np.float64)
            self.episode_return += reward
            self.episode_length += 1
            done = terminated | truncated
            if truncated.any():
                idx = np.nonzero(truncated & ~terminated)[0]
                if len(idx):
                    final = self._final_obs(info, idx)
                    reward = reward.copy()
                    reward[idx] += gamma * self.policy.value(final)
            reward_buf[t] = reward
            done_buf[t] = done
            if done.any():
                for i in np.nonzero(done)[0]:
                    returns.append(float(self.episode_return[i]))
                    lengths.append(int(self.episode_length[i]))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
            self.obs = flatten_obs(self.single_obs_space, raw_obs, n)
            if self.mask is not None:
                self.mask = _masks(info, n, self.info.action_dims[0])
        self.env_steps += num_steps * n
        batch = {
            "obs": obs_buf, "actions": actions_buf, "logprobs": logp_buf, "values": value_buf,
            "rewards": reward_buf, "dones": done_buf, "last_values": self.policy.value(self.obs).astype(np.float32),
            "episode_returns": np.asarray(returns), "episode_lengths": np.asarray(lengths, np.int64),
            "env_steps": num_steps * n, "sample_seconds": time.perf_counter() - t0, "version": version,
            "worker_index": self.worker_index, "idle_seconds": idle, "node": self.node,
        }
        self._last_end = time.perf_counter()
        if mask_buf is not None:
            batch["masks"] = mask_buf
        return batch

    # ---- off-policy (DQN, BDQ, tabular) -----------------------------------------------------------

    def sample_offpolicy(self, params, version: int, num_steps: int, epsilon: float, gamma: float,
                         n_step: int) -> dict[str, Any]:
        """Collect `num_steps` steps of every env epsilon-greedily; return n-step transitions."""
        idle = self._idle()
        if params is not None:
            self.set_weights(params, version)
        if self._nstep is None or self._nstep.n != n_step or self._nstep.gamma != gamma:
            self._nstep = _NStepAccumulator(n_step, gamma, self.num_envs)
        acc = self._nstep
        returns, lengths = [], []
        t0 = time.perf_counter()
        for _ in range(num_steps):
            actions = self.policy.act(self.rng, self.obs, self.mask, epsilon=epsilon)
            raw_obs, reward, terminated, truncated, info = self.env.step(self._env_actions(actions))
            reward = np.asarray(reward, dtype=np.float64)
            self.episode_return += reward
            self.episode_length += 1
            done = terminated | truncated
            next_obs = flatten_obs(self.single_obs_space, raw_obs, self.num_envs)
            next_mask = _masks(info, self.num_envs, self.info.action_dims[0]) if self.mask is not None else None
            # For envs whose episode ended, the transition's successor is the final observation.
            succ_obs, succ_mask = next_obs, next_mask
            if done.any():
                idx = np.nonzero(done)[0]
                succ_obs = next_obs.copy()
                succ_obs[idx] = self._final_obs(info, idx)
                if next_mask is not None:
                    succ_mask = next_mask.copy()
                    succ_mask[idx] = self._final_mask(info, idx, next_mask.shape[1])
                for i in idx:
                    returns.append(float(self.episode_return[i]))
                    lengths.append(int(self.episode_length[i]))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
            acc.add(self.obs, actions, reward, succ_obs, terminated, done, succ_mask)
            self.obs, self.mask = next_obs, next_mask
        self.env_steps += num_steps * self.num_envs
        batch = acc.drain()
        batch.update({
            "episode_returns": np.asarray(returns), "episode_lengths": np.asarray(lengths, np.int64),
            "env_steps": num_steps * self.num_envs, "sample_seconds": time.perf_counter() - t0,
            "version": self.weights_version, "worker_index": self.worker_index, "idle_seconds": idle,
            "node": self.node,
        })
        self._last_end = time.perf_counter()
        return batch

    # ---- evaluation ----------------------------------------------------------------------------

    def evaluate(self, params, version: int, seeds: list[int], env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Deterministic (greedy) episodes, one per seed, on separate env copies (kwargs overridable).

        The episodes run side by side in a vector env (one env per seed, `EVAL_CHUNK` at a time, one
        batched forward pass per step); each env is reset with its own seed, so an episode is the one
        a lone env reset with that seed plays (`evaluate_sequential`, the reference tests compare with).
        """
        if params is not None:
            self.set_weights(params, version)
        kwargs = {**self.env_kwargs, **(env_kwargs or {})}
        returns: list[float] = []
        lengths: list[int] = []
        for start in range(0, len(seeds), EVAL_CHUNK):
            chunk = [int(s) for s in seeds[start:start + EVAL_CHUNK]]
            env = make_vector_env(self.env_id, kwargs, len(chunk), self.max_episode_steps)
            try:
                r, n = self._evaluate_vector(env, chunk)
            finally:
                env.close()
            returns += r
            lengths += n
        return {"returns": returns, "lengths": lengths}

    def _evaluate_vector(self, env, seeds: list[int]) -> tuple[list[float], list[int]]:
        n = len(seeds)
        n_act = self.info.action_dims[0] if self.info.action_kind == "Discrete" else 0
        raw, info = env.reset(seed=seeds)
        total = np.zeros(n)
        steps = np.zeros(n, np.int64)
        running = np.ones(n, bool)
        while running.any():
            obs = flatten_obs(self.single_obs_space, raw, n)
            mask = _masks(info, n, n_act) if n_act else None
            actions = self.greedy(obs, mask)
            raw, reward, terminated, truncated, info = env.step(self._env_actions(np.asarray(actions)))
            # Envs whose episode is over autoreset and play on; only each seed's first episode counts.
            total += np.where(running, np.asarray(reward, np.float64), 0.0)
            steps += running
            running &= ~(np.asarray(terminated) | np.asarray(truncated))
        return [float(x) for x in total], [int(x) for x in steps]

    def evaluate_sequential(self, params, version: int, seeds: list[int],
                            env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The reference for `evaluate`: one env, one seed after another, one step at a time."""
        if params is not None:
            self.set_weights(params, version)
        env = make_env(self.env_id, {**self.env_kwargs, **(env_kwargs or {})}, self.max_episode_steps)
        returns, lengths = [], []
        try:
            for seed in seeds:
                raw, info = env.reset(seed=int(seed))
                total, steps, done = 0.0, 0, False
                while not done:
                    obs = flatten_obs(self.single_obs_space, _batch1(raw), 1)
                    mask = _masks(_batch1_info(info), 1, self.info.action_dims[0]) \
                        if self.info.action_kind == "Discrete" else None
                    action = self.greedy(obs, mask)[0]
                    raw, reward, terminated, truncated, info = env.step(self._env_actions(np.asarray([action]))[0])
                    total += float(reward)
                    steps += 1
                    done = terminated or truncated
                returns.append(total)
                lengths.append(steps)
        finally:
            env.close()
        return {"returns": returns, "lengths": lengths}

    def greedy(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        if isinstance(self.policy, ActorCriticPolicy):
            return self.policy.act(self.rng, obs, mask, deterministic=True)[0]
        return self.policy.act(self.rng, obs, mask, epsilon=0.0)

    # ---- helpers -------------------------------------------------------------------------------

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.info.action_kind == "Box":
            shape = self.info.action_dims
            low = np.asarray(self.info.action_low).reshape(shape)
            high = np.asarray(self.info.action_high).reshape(shape)
            return np.clip(actions.reshape(-1, *shape), low, high).astype(np.float32)
        return actions

    def _final_obs(self, info: dict, idx: np.ndarray) -> np.ndarray:
        final = info["final_obs"]
        if isinstance(final, dict):  # a numpy-batched env: one array per key, not one dict per env
            return flatten_obs(self.single_obs_space, {k: np.asarray(v)[idx] for k, v in final.items()}, len(idx))
        items = [final[i] for i in idx]
        if isinstance(self.single_obs_space, gym.spaces.Dict):
            stacked = {k: np.stack([it[k] for it in items]) for k in self.single_obs_space.spaces}
        else:
            stacked = np.stack(items)
        return flatten_obs(self.single_obs_space, stacked, len(idx))

    def _final_mask(self, info: dict, idx: np.ndarray, n_actions: int) -> np.ndarray:
        finals = info.get("final_info", {})
        mask = finals.get("action_mask") if isinstance(finals, dict) else None
        if mask is None:
            return np.ones((len(idx), n_actions), bool)
        return np.asarray(mask, bool).reshape(-1, n_actions)[idx]

    def close(self) -> None:
        self.env.close()


def _ray_node_id() -> str:
    """The Ray node this worker runs on ("" outside Ray), so a learner can see how actors spread."""
    import sys

    if "ray" not in sys.modules:
        return ""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def _batch1(raw):
    if isinstance(raw, dict):
        return {k: np.asarray(v)[None] for k, v in raw.items()}
    return np.asarray(raw)[None]


def _batch1_info(info: dict) -> dict:
    if "action_mask" in info:
        return {"action_mask": np.asarray(info["action_mask"])[None]}
    return {}


class _NStepAccumulator:
    """Turns per-step vector-env data into n-step transitions, carrying partial ones across batches.

    A transition started at step t holds R = sum_{i<k} gamma^i r_{t+i}, the observation after k
    steps, `done` (terminated within them) and `discount` = gamma^k, with k = n unless the
    episode ended first.
    """

    def __init__(self, n: int, gamma: float, num_envs: int):
        self.n, self.gamma, self.num_envs = n, gamma, num_envs
        self.pending: list[list[tuple]] = [[] for _ in range(num_envs)]  # per env: [obs, action, reward]
        self.out: dict[str, list] = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "dones",
                                                     "discounts", "next_masks")}
        self.steps: list[tuple] = []  # n == 1: one tuple of arrays per vector step

    def _drain_steps(self) -> dict[str, np.ndarray]:
        """The 1-step transitions in the order the per-env path emits them (step, then env)."""
        steps, self.steps = self.steps, []
        if not steps:
            return {"obs": np.zeros((0,), np.float32), "actions": np.zeros((0,)), "rewards": np.zeros(0, np.float32),
                    "next_obs": np.zeros((0,), np.float32), "dones": np.zeros(0, np.float32),
                    "discounts": np.zeros(0, np.float32)}
        obs, actions, rewards, next_obs, dones, masks = (list(col) for col in zip(*steps))
        rewards_all = np.concatenate(rewards)
        batch = {"obs": np.concatenate(obs), "actions": np.concatenate(actions), "rewards": rewards_all,
                 "next_obs": np.concatenate(next_obs), "dones": np.concatenate(dones),
                 "discounts": np.full(len(rewards_all), self.gamma, np.float32)}
        if masks[0] is not None:
            batch["next_masks"] = np.concatenate(masks)
        return batch

    def _emit(self, env: int, k: int, next_obs, done: bool, next_mask) -> None:
        obs, action, _ = self.pending[env][0]
        ret = 0.0
        for i in range(k):
            ret += (self.gamma**i) * self.pending[env][i][2]
        self.out["obs"].append(obs)
        self.out["actions"].append(action)
        self.out["rewards"].append(ret)
        self.out["next_obs"].append(next_obs)
        self.out["dones"].append(float(done))
        self.out["discounts"].append(self.gamma**k)
        self.out["next_masks"].append(next_mask)
        self.pending[env].pop(0)

    def add(self, obs, actions, rewards, next_obs, terminated, done, next_mask) -> None:
        if self.n == 1:  # every env emits its 1-step transition now: whole arrays, no per-env Python
            self.steps.append((np.array(obs, np.float32), np.array(actions), np.asarray(rewards, np.float32),
                               np.array(next_obs, np.float32), np.asarray(terminated, np.float32),
                               None if next_mask is None else np.array(next_mask, bool)))
            return
        self._add_per_env(obs, actions, rewards, next_obs, terminated, done, next_mask)

    def _add_per_env(self, obs, actions, rewards, next_obs, terminated, done, next_mask) -> None:
        for e in range(self.num_envs):
            self.pending[e].append((obs[e], actions[e], float(rewards[e])))
            nm = None if next_mask is None else next_mask[e]
            if done[e]:
                while self.pending[e]:
                    self._emit(e, len(self.pending[e]), next_obs[e], bool(terminated[e]), nm)
            elif len(self.pending[e]) == self.n:
                self._emit(e, self.n, next_obs[e], False, nm)

    def drain(self) -> dict[str, np.ndarray]:
        if self.steps:
            return self._drain_steps()
        out = self.out
        batch = {
            "obs": np.asarray(out["obs"], np.float32),
            "actions": np.asarray(out["actions"]),
            "rewards": np.asarray(out["rewards"], np.float32),
            "next_obs": np.asarray(out["next_obs"], np.float32),
            "dones": np.asarray(out["dones"], np.float32),
            "discounts": np.asarray(out["discounts"], np.float32),
        }
        if out["next_masks"] and out["next_masks"][0] is not None:
            batch["next_masks"] = np.asarray(out["next_masks"], bool)
        self.out = {k: [] for k in out}
        return batch

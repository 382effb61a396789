"""Rollout workers: step a gymnasium vector env with batched numpy inference and return numpy batches.

`RolloutWorker` is plain Python (tests run it without Ray); `workers.py` makes it a Ray actor. Its
`Sampler` collects what the learner trains on, its `GreedyEvaluator` plays evaluation episodes.
It imports numpy and gymnasium only: workers never load torch.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np

from kuberl.trainer.policies import make_policy
from kuberl.trainer.preferences.steps import StepRecorder
from kuberl.trainer.selfplay import attach_self_play
from kuberl.trainer.spaces import SpaceInfo, flatten_obs, space_info


def make_env(env_id: str, kwargs: dict[str, Any], max_episode_steps: int | None = None) -> gym.Env:
    """One environment from a gymnasium id, a KubeRL id or `module:Class`."""
    from kuberl.trainer.envs.resolve import resolve_env_factory

    env = resolve_env_factory(env_id)(**kwargs)
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)
    return env


def make_vector_env(env_id: str, kwargs: dict[str, Any], num_envs: int, max_episode_steps: int | None = None,
                    batched: bool = True, multi_agent: dict[str, Any] | None = None):
    """`num_envs` copies stepped together: a numpy-batched implementation where KubeRL has one
    (`envs/batched.py`; same episodes as the per-env reference), else gymnasium's SyncVectorEnv. With
    `multi_agent` (environment.multiAgent as a dict) a PettingZoo env: one entry per agent of each copy, or
    with self-play one per copy (the learner's agent's)."""
    if multi_agent is not None:
        from kuberl.trainer.envs.resolve import agents_vector

        return agents_vector(env_id, kwargs, multi_agent, num_envs, max_episode_steps)
    if batched:
        from kuberl.trainer.envs.batched import make_batched

        env = make_batched(env_id, kwargs, num_envs, max_episode_steps)
        if env is not None:
            return env
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(env_id, kwargs, max_episode_steps) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def probe_env(env_spec):
    """One copy of environment spec `env_spec`'s env, to read its spaces: a gymnasium env, or for a
    PettingZoo env its vector of agents (`policy_spaces` reads either)."""
    if env_spec.multi_agent is not None:
        return make_vector_env(env_spec.id, env_spec.kwargs, 1, env_spec.max_episode_steps,
                               multi_agent=env_spec.multi_agent.model_dump())
    return make_env(env_spec.id, env_spec.kwargs, env_spec.max_episode_steps)


def policy_spaces(env) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) the policy acts in: the env's, or one agent's of a PettingZoo env."""
    if hasattr(env, "single_observation_space"):
        return env.single_observation_space, env.single_action_space
    return env.observation_space, env.action_space


def env_spaces(env_spec) -> tuple[gym.Space, gym.Space]:
    """`policy_spaces` of environment spec `env_spec`'s env."""
    env = probe_env(env_spec)
    try:
        return policy_spaces(env)
    finally:
        env.close()


#: Evaluation episodes stepped side by side in one vector env.
EVAL_CHUNK = 256


def _masks(info: dict, n_envs: int, n_actions: int) -> np.ndarray | None:
    mask = info.get("action_mask")
    if mask is None:
        return None
    return np.asarray(mask, dtype=bool).reshape(n_envs, n_actions)


def _env_actions(info: SpaceInfo, actions: np.ndarray) -> np.ndarray:
    """Actions as the env takes them: a Box's clipped into its bounds and shaped like it."""
    if info.action_kind == "Box":
        shape = info.action_dims
        low = np.asarray(info.action_low).reshape(shape)
        high = np.asarray(info.action_high).reshape(shape)
        return np.clip(actions.reshape(-1, *shape), low, high).astype(np.float32)
    return actions


def _final_obs(obs_space: gym.Space, info: dict, idx: np.ndarray) -> np.ndarray:
    """The last observations of the episodes that ended in envs `idx` (the env has reset them)."""
    final = info["final_obs"]
    if isinstance(final, dict):  # a numpy-batched env: one array per key, not one dict per env
        return flatten_obs(obs_space, {k: np.asarray(v)[idx] for k, v in final.items()}, len(idx))
    items = [final[i] for i in idx]
    if isinstance(obs_space, gym.spaces.Dict):
        stacked = {k: np.stack([it[k] for it in items]) for k in obs_space.spaces}
    else:
        stacked = np.stack(items)
    return flatten_obs(obs_space, stacked, len(idx))


def _final_mask(info: dict, idx: np.ndarray, n_actions: int) -> np.ndarray:
    finals = info.get("final_info", {})
    mask = finals.get("action_mask") if isinstance(finals, dict) else None
    if mask is None:
        return np.ones((len(idx), n_actions), bool)
    return np.asarray(mask, bool).reshape(-1, n_actions)[idx]


class RolloutWorker:
    """Owns `num_envs` copies of one environment and the acting half of the policy: the Ray actor the
    learner calls. It loads the weights it is sent; its `Sampler` collects training batches from its
    envs, its `GreedyEvaluator` plays evaluation episodes on env copies of their own."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], num_envs: int, seed: int,
                 policy: dict[str, Any], max_episode_steps: int | None = None, worker_index: int = 0,
                 record_steps: bool = False, multi_agent: dict[str, Any] | None = None):
        from kuberl.trainer.envs.multiagent import MultiAgentEnvError
        from kuberl.trainer.envs.resolve import EnvNotFound

        self.worker_index = worker_index
        #: Why this worker cannot build the job's environment (its image lacks the module): `ping` says
        #: so and the learner fails the job with it, where an actor dying in its constructor would be
        #: replaced by one that dies the same way, again and again.
        self.env_problem: str | None = None
        try:
            env = make_vector_env(env_id, env_kwargs, num_envs, max_episode_steps, multi_agent=multi_agent)
        except (EnvNotFound, MultiAgentEnvError) as err:
            self.env_problem = str(err)
            return
        self.info = space_info(env.single_observation_space, env.single_action_space)
        self.rng = np.random.default_rng([seed, worker_index, 7])
        self.policy = make_policy(self.info, policy)
        self.weights_version = -1
        self.sampler = Sampler(env, self.info, [seed * 10_007 + worker_index * 1_000 + i for i in range(num_envs)],
                               record_steps)
        self.evaluator = GreedyEvaluator(env_id, env_kwargs, max_episode_steps, self.info, env.single_observation_space,
                                         multi_agent)
        self.node = _ray_node_id()
        self._last_end: float | None = None  # end of the previous sample call: the gap is time spent waiting
        self.hooks: list = []  # callables(worker) run after weights change (e.g. self-play opponent refresh)
        self.self_play_opponent = attach_self_play(self)  # None unless a two-player env asks for self-play

    @property
    def env(self):
        """The vector env the worker trains on."""
        return self.sampler.env

    def set_weights(self, params: dict[str, np.ndarray], version: int) -> None:
        if version != self.weights_version:
            self.policy.load(params)
            self.weights_version = version
            for hook in self.hooks:
                hook(self)

    def pid(self) -> int:
        return os.getpid()

    def run(self, fn, *args: Any) -> Any:
        """`fn(self, *args)` here: scenario code that needs this worker's policy (evaluation games)."""
        return fn(self, *args)

    def ping(self) -> dict[str, Any]:
        """Ready: this worker's index and the thread pools it computes with, as its own process sees them
        (its container's CPUs, not the node's: kuberl.trainer.threads); `env_problem`, when it has no env."""
        from kuberl.trainer.threads import THREAD_ENV, container_cpus

        return {"index": self.worker_index, "container_cpus": container_cpus(),
                "pools": {var: os.environ.get(var, "unset") for var in THREAD_ENV}, "env_problem": self.env_problem}

    # ---- sampling: what the learner trains on -----------------------------------------------------

    def sample_onpolicy(self, params, version: int, num_steps: int, gamma: float) -> dict[str, Any]:
        """`num_steps` steps of every env with the stochastic policy (PPO): `Sampler.onpolicy`."""
        idle = self._idle()
        self.set_weights(params, version)
        t0 = time.perf_counter()
        batch = self.sampler.onpolicy(self.policy, self.rng, num_steps, gamma)
        return self._stamp(batch, t0, idle, version)

    def sample_offpolicy(self, params, version: int, num_steps: int, epsilon: float, gamma: float,
                         n_step: int) -> dict[str, Any]:
        """`num_steps` steps of every env epsilon-greedily (DQN, BDQ, tabular): `Sampler.offpolicy`.
        `params` None keeps the weights the worker has."""
        idle = self._idle()
        if params is not None:
            self.set_weights(params, version)
        t0 = time.perf_counter()
        batch = self.sampler.offpolicy(self.policy, self.rng, num_steps, epsilon, gamma, n_step)
        return self._stamp(batch, t0, idle, self.weights_version)

    def _idle(self) -> float:
        return 0.0 if self._last_end is None else time.perf_counter() - self._last_end

    def _stamp(self, batch: dict[str, Any], t0: float, idle: float, version: int) -> dict[str, Any]:
        """Where and when a batch was collected, and with which weights."""
        batch.update({"sample_seconds": time.perf_counter() - t0, "version": version,
                      "worker_index": self.worker_index, "idle_seconds": idle, "node": self.node})
        self._last_end = time.perf_counter()
        return batch

    # ---- evaluation: greedy episodes ------------------------------------------------------------

    def evaluate(self, params, version: int, seeds: list[int],
                 env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Greedy episodes, one per seed, side by side: `GreedyEvaluator.episodes`."""
        if params is not None:
            self.set_weights(params, version)
        return self.evaluator.episodes(self.policy, seeds, env_kwargs)

    def close(self) -> None:
        self.env.close()


class _Episodes:
    """Return and length of every env's running episode, and those of the episodes that ended."""

    def __init__(self, num_envs: int):
        self.running_return = np.zeros(num_envs)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.entries: list[int] = []  # the env (or agent entry) each ended episode was in: policy groups split by it

    def step(self, reward: np.ndarray, done: np.ndarray, acted: np.ndarray | None = None) -> np.ndarray | None:
        """Adds one step (of the entries that `acted`, where some did not: agents gone before the others);
        returns the envs whose episode ended with it (None when none did)."""
        self.running_return += reward
        self.running_length += 1 if acted is None else acted
        if not done.any():
            return None
        ended = np.nonzero(done)[0]
        for i in ended:
            self.returns.append(float(self.running_return[i]))
            self.lengths.append(int(self.running_length[i]))
            self.entries.append(int(i))
        self.running_return[done] = 0.0
        self.running_length[done] = 0
        return ended

    def drain(self) -> dict[str, np.ndarray]:
        """The ended episodes' returns and lengths since the last drain."""
        out = {"episode_returns": np.asarray(self.returns), "episode_lengths": np.asarray(self.lengths, np.int64),
               "episode_entries": np.asarray(self.entries, np.int64)}
        self.returns, self.lengths, self.entries = [], [], []
        return out


class Sampler:
    """The worker's vector env and where its episodes stand. Each call steps every env `num_steps`
    times from where the previous call left them, and returns the batch the learner trains on."""

    def __init__(self, env, info: SpaceInfo, seeds: list[int], record_steps: bool = False):
        self.env, self.info = env, info
        # Off-policy batches also carry per-step records (the preference head's segments): preferences/steps.py
        self.recorder = StepRecorder() if record_steps else None
        self.num_envs = env.num_envs  # a PettingZoo env: an entry per agent of each of len(seeds) copies
        self.obs_space = env.single_observation_space
        raw_obs, reset_info = env.reset(seed=seeds)
        self.obs = flatten_obs(self.obs_space, raw_obs, self.num_envs)
        n_act = info.action_dims[0] if info.action_kind == "Discrete" else 0
        self.mask = _masks(reset_info, self.num_envs, n_act) if n_act else None
        #: Which entries act in the next step (None: all, always); a PettingZoo env's agents can leave early.
        self.alive: np.ndarray | None = reset_info.get("alive")
        self.episodes = _Episodes(self.num_envs)
        self.env_steps = 0
        self._nstep: _NStepAccumulator | None = None

    def onpolicy(self, policy, rng: np.random.Generator, num_steps: int, gamma: float) -> dict[str, Any]:
        """[num_steps, num_envs] trajectories of the stochastic policy. Rewards of truncated episodes
        get gamma * V(final obs) folded in, so time limits are not treated as terminal."""
        n, info = self.num_envs, self.info
        batch = _onpolicy_arrays(info, num_steps, n, masked=self.mask is not None, alive=self.alive is not None)
        mask_buf = batch.get("masks")
        for t in range(num_steps):
            acted = self.alive
            batch["obs"][t] = self.obs
            if mask_buf is not None:
                mask_buf[t] = self.mask
            actions, logp, value = policy.act(rng, self.obs, self.mask)
            batch["actions"][t] = actions
            batch["logprobs"][t] = logp
            batch["values"][t] = value
            raw_obs, reward, terminated, truncated, step_info = self.env.step(_env_actions(info, actions))
            reward = np.asarray(reward, dtype=np.float64)
            done = terminated | truncated
            self.episodes.step(reward, done, acted)
            if truncated.any():
                idx = np.nonzero(truncated & ~terminated)[0]
                if len(idx):
                    reward = reward.copy()
                    reward[idx] += gamma * policy.value(_final_obs(self.obs_space, step_info, idx))
            batch["rewards"][t] = reward
            if acted is None:
                batch["dones"][t] = done
            else:  # a step an agent sat out: its own one-step episode, cut from its neighbours, then left out
                batch["dones"][t] = done | ~acted
                batch["alive"][t], self.alive = acted, step_info["alive"]
            self.obs = flatten_obs(self.obs_space, raw_obs, n)
            if self.mask is not None:
                self.mask = _masks(step_info, n, info.action_dims[0])
        steps = num_steps * n if "alive" not in batch else int(batch["alive"].sum())
        self.env_steps += steps
        batch["last_values"] = policy.value(self.obs).astype(np.float32)
        return {**batch, **self.episodes.drain(), "env_steps": steps}

    def offpolicy(self, policy, rng: np.random.Generator, num_steps: int, epsilon: float, gamma: float,
                  n_step: int) -> dict[str, Any]:
        """n-step transitions of the epsilon-greedy policy (`_NStepAccumulator`; a transition still
        short of n steps waits for the next call)."""
        if self._nstep is None or self._nstep.n != n_step or self._nstep.gamma != gamma:
            self._nstep = _NStepAccumulator(n_step, gamma, self.num_envs)
        n, info, transitions = self.num_envs, self.info, self._nstep
        steps_taken = 0
        for _ in range(num_steps):
            acted = self.alive
            steps_taken += n if acted is None else int(acted.sum())
            actions = policy.act(rng, self.obs, self.mask, epsilon=epsilon)
            raw_obs, reward, terminated, truncated, step_info = self.env.step(_env_actions(info, actions))
            reward = np.asarray(reward, dtype=np.float64)
            done = terminated | truncated
            ended = self.episodes.step(reward, done, acted)
            next_obs = flatten_obs(self.obs_space, raw_obs, n)
            next_mask = _masks(step_info, n, info.action_dims[0]) if self.mask is not None else None
            # For envs whose episode ended, the transition's successor is the final observation.
            succ_obs, succ_mask = next_obs, next_mask
            if ended is not None:
                succ_obs = next_obs.copy()
                succ_obs[ended] = _final_obs(self.obs_space, step_info, ended)
                if next_mask is not None:
                    succ_mask = next_mask.copy()
                    succ_mask[ended] = _final_mask(step_info, ended, next_mask.shape[1])
            transitions.add(self.obs, actions, reward, succ_obs, terminated, done, succ_mask, acted)
            if self.recorder is not None:
                self.recorder.add(self.obs, actions, reward, step_info, ended)
            self.obs, self.mask = next_obs, next_mask
            if acted is not None:
                self.alive = step_info["alive"]
        self.env_steps += steps_taken
        steps = {} if self.recorder is None else {"steps": self.recorder.drain()}
        return {**transitions.drain(), **self.episodes.drain(), "env_steps": steps_taken, **steps}


def _onpolicy_arrays(info: SpaceInfo, num_steps: int, n: int, masked: bool, alive: bool = False
                     ) -> dict[str, np.ndarray]:
    """Empty [num_steps, n, ...] arrays for one on-policy batch."""
    if info.action_kind == "Discrete":
        act_shape: tuple[int, ...] = ()
    elif info.action_kind == "MultiDiscrete":
        act_shape = (len(info.action_dims),)
    else:
        act_shape = (int(np.prod(info.action_dims)),)
    arrays = {
        "obs": np.empty((num_steps, n, info.obs_dim), np.float32),
        "actions": np.empty((num_steps, n, *act_shape), np.float32 if info.action_kind == "Box" else np.int64),
        "logprobs": np.empty((num_steps, n), np.float32),
        "values": np.empty((num_steps, n), np.float32),
        "rewards": np.empty((num_steps, n), np.float32),
        "dones": np.empty((num_steps, n), np.float32),
    }
    if masked:
        arrays["masks"] = np.empty((num_steps, n, info.action_dims[0]), bool)
    if alive:  # which steps an agent acted in: PPO learns from those only
        arrays["alive"] = np.empty((num_steps, n), bool)
    return arrays


class GreedyEvaluator:
    """Greedy (deterministic) episodes, one per seed, each on an env copy reset with that seed (kwargs
    overridable): the worker's training envs keep their episodes."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], max_episode_steps: int | None, info: SpaceInfo,
                 obs_space: gym.Space, multi_agent: dict[str, Any] | None = None):
        self.env_id, self.env_kwargs, self.max_episode_steps = env_id, env_kwargs, max_episode_steps
        self.info, self.obs_space, self.multi_agent = info, obs_space, multi_agent

    def episodes(self, policy, seeds: list[int], env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The episodes run side by side in a vector env (one env per seed, `EVAL_CHUNK` at a time, one
        batched forward pass per step); each env is reset with its own seed, so an episode is the one
        a lone env reset with that seed plays. A PettingZoo env's episodes are its agents': one per agent
        of each seed's copy."""
        kwargs = {**self.env_kwargs, **(env_kwargs or {})}
        returns: list[float] = []
        lengths: list[int] = []
        policies: list[str] = []
        for start in range(0, len(seeds), EVAL_CHUNK):
            chunk = [int(s) for s in seeds[start:start + EVAL_CHUNK]]
            env = make_vector_env(self.env_id, kwargs, len(chunk), self.max_episode_steps,
                                  multi_agent=self.multi_agent)
            try:
                r, n, p = self._play_side_by_side(policy, env, chunk)
            finally:
                env.close()
            returns += r
            lengths += n
            policies += p
        # Policy groups: which group's agent played each episode, so the evaluation reports each group's return.
        return {"returns": returns, "lengths": lengths, **({"policies": policies} if policies else {})}

    def _play_side_by_side(self, policy, env, seeds: list[int]) -> tuple[list[float], list[int], list[str]]:
        """Each episode's return and length, and with policy groups the group of the agent that played it."""
        n = env.num_envs
        n_act = self.info.action_dims[0] if self.info.action_kind == "Discrete" else 0
        raw, info = env.reset(seed=seeds)
        total = np.zeros(n)
        steps = np.zeros(n, np.int64)
        # An agent absent from its copy's start plays no episode there.
        playing = np.asarray(info.get("alive", np.ones(n, bool)), bool)
        running = playing.copy()
        while running.any():
            obs = flatten_obs(self.obs_space, raw, n)
            mask = _masks(info, n, n_act) if n_act else None
            actions = policy.greedy(obs, mask)
            raw, reward, terminated, truncated, info = env.step(_env_actions(self.info, np.asarray(actions)))
            # Envs whose episode is over autoreset and play on; only each seed's first episode counts.
            total += np.where(running, np.asarray(reward, np.float64), 0.0)
            steps += running
            running &= ~(np.asarray(terminated) | np.asarray(truncated))
        groups = getattr(env, "groups", None) or []
        names = [] if len(groups) < 2 else [next(g.name for g in groups if slot % env.n_agents in g.agents)
                                            for slot in np.nonzero(playing)[0]]
        return [float(x) for x in total[playing]], [int(x) for x in steps[playing]], names


def _ray_node_id() -> str:
    """The Ray node this worker runs on ("" outside Ray), so a learner can see how actors spread."""
    import sys

    if "ray" not in sys.modules:
        return ""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


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
                                                     "discounts", "next_masks", "entries")}
        self.steps: list[tuple] = []  # n == 1: one tuple of arrays per vector step

    def _drain_steps(self) -> dict[str, np.ndarray]:
        """The 1-step transitions in the order the per-env path emits them (step, then env)."""
        steps, self.steps = self.steps, []
        if not steps:
            return {"obs": np.zeros((0,), np.float32), "actions": np.zeros((0,)), "rewards": np.zeros(0, np.float32),
                    "next_obs": np.zeros((0,), np.float32), "dones": np.zeros(0, np.float32),
                    "discounts": np.zeros(0, np.float32), "entries": np.zeros(0, np.int64)}
        obs, actions, rewards, next_obs, dones, masks, entries = (list(col) for col in zip(*steps, strict=False))
        rewards_all = np.concatenate(rewards)
        batch = {"obs": np.concatenate(obs), "actions": np.concatenate(actions), "rewards": rewards_all,
                 "next_obs": np.concatenate(next_obs), "dones": np.concatenate(dones),
                 "discounts": np.full(len(rewards_all), self.gamma, np.float32), "entries": np.concatenate(entries)}
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
        self.out["entries"].append(env)
        self.pending[env].pop(0)

    def add(self, obs, actions, rewards, next_obs, terminated, done, next_mask, acted=None) -> None:
        """One vector step; `acted` (None: all) the entries whose agents acted in it: only theirs are transitions.
        Each transition keeps its entry's index (`entries`: policy groups split the transitions by it)."""
        entries = np.arange(self.num_envs)
        if acted is not None and not acted.all():
            keep = np.nonzero(acted)[0]
            if self.n > 1:
                self._add_per_env(obs, actions, rewards, next_obs, terminated, done, next_mask, keep)
                return
            obs, actions, rewards, next_obs, terminated = (np.asarray(a)[keep] for a in
                                                           (obs, actions, rewards, next_obs, terminated))
            next_mask = None if next_mask is None else np.asarray(next_mask)[keep]
            entries = keep
        if self.n == 1:  # every env emits its 1-step transition now: whole arrays, no per-env Python
            self.steps.append((np.array(obs, np.float32), np.array(actions), np.asarray(rewards, np.float32),
                               np.array(next_obs, np.float32), np.asarray(terminated, np.float32),
                               None if next_mask is None else np.array(next_mask, bool), entries))
            return
        self._add_per_env(obs, actions, rewards, next_obs, terminated, done, next_mask)

    def _add_per_env(self, obs, actions, rewards, next_obs, terminated, done, next_mask, envs=None) -> None:
        for e in range(self.num_envs) if envs is None else envs:
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
            "entries": np.asarray(out["entries"], np.int64),
        }
        if out["next_masks"] and out["next_masks"][0] is not None:
            batch["next_masks"] = np.asarray(out["next_masks"], bool)
        self.out = {k: [] for k in out}
        return batch

"""The time-to-solve protocol every CartPole contender follows (KubeRL, SB3, RLlib alike).

Imports numpy and gymnasium only, so each peer's own virtualenv can import it too.

Solved = the mean of the last 100 *training* episodes is >= 475, THEN a 100-episode deterministic
(greedy) evaluation on seeds 10000..10099 is >= 475. An evaluation that fails lets training go on;
the check repeats once `recheck_steps` more env steps have been collected (same for everyone).
The clock is training time: every second spent evaluating is subtracted and reported on its own.

In `hold` mode (the DQN stability run) training does not stop when solved: it goes on to the
env-step budget with a deterministic evaluation every `curve_every` env steps (the curve) and one
at the end.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

TARGET = 475.0
WINDOW = 100
EVAL_SEEDS = list(range(10_000, 10_100))
RESULT_PREFIX = "BENCH_RESULT "


def greedy_eval(act: Callable[[np.ndarray], np.ndarray], seeds: list[int] = EVAL_SEEDS,
                env_id: str = "CartPole-v1") -> dict[str, Any]:
    """One deterministic episode per seed, all seeds stepped together; `act(obs[B, D]) -> actions[B]`."""
    envs = [gym.make(env_id) for _ in seeds]
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)]).astype(np.float32)
    returns = np.zeros(len(seeds))
    active = np.ones(len(seeds), bool)
    while active.any():
        idx = np.nonzero(active)[0]
        actions = np.asarray(act(obs[idx])).reshape(-1)
        for j, i in enumerate(idx):
            o, r, term, trunc, _ = envs[i].step(int(actions[j]))
            returns[i] += r
            obs[i] = o
            if term or trunc:
                active[i] = False
    for env in envs:
        env.close()
    return {"episodes": len(seeds), "mean_return": float(returns.mean()), "min_return": float(returns.min())}


class SolveClock:
    """Feed it after every training iteration; it says when to stop and keeps the record."""

    def __init__(self, budget_steps: int, budget_seconds: float, recheck_steps: int = 5_000,
                 hold: bool = False, curve_every: int = 25_000):
        self.budget_steps, self.budget_seconds = budget_steps, budget_seconds
        self.recheck_steps, self.hold, self.curve_every = recheck_steps, hold, curve_every
        self.t0 = time.perf_counter()
        self.eval_seconds = 0.0
        self.next_check = 0
        self.next_curve = curve_every
        self.solved_seconds: float | None = None
        self.solved_steps: int | None = None
        self.checks: list[dict[str, Any]] = []  # every solve-check evaluation
        self.curve: list[dict[str, Any]] = []  # hold mode: periodic evaluations
        self.env_steps = 0
        self.window_mean: float | None = None
        self.stop_reason: str | None = None
        self.last_now = 0.0  # training seconds at the last update (a contender's clock is read before evals)

    def restart(self) -> None:
        """Start the clock now (a contender calls it just before its training loop begins)."""
        self.t0 = time.perf_counter()
        self.eval_seconds = 0.0

    def train_seconds(self, external: float | None = None) -> float:
        """Training time so far: the contender's own clock when given, else ours, less evaluation."""
        raw = external if external is not None else time.perf_counter() - self.t0
        return raw - self.eval_seconds

    def _evaluate(self, evaluate: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        t = time.perf_counter()
        res = evaluate()
        spent = time.perf_counter() - t
        self.eval_seconds += spent
        return {**res, "eval_seconds": round(spent, 3)}

    def update(self, env_steps: int, window_full: bool, window_mean: float | None,
               evaluate: Callable[[], dict[str, Any]], clock: float | None = None) -> bool:
        """Account one iteration; returns True when training should stop."""
        self.env_steps = env_steps
        self.window_mean = window_mean
        now = self.last_now = self.train_seconds(clock)
        ev = None
        if (self.solved_seconds is None and window_full and window_mean is not None
                and window_mean >= TARGET and env_steps >= self.next_check):
            ev = self._evaluate(evaluate)
            self.checks.append({"env_steps": env_steps, "train_seconds": round(now, 3),
                                "window_mean": round(window_mean, 2), **ev})
            if ev["mean_return"] >= TARGET:
                self.solved_seconds, self.solved_steps = now, env_steps
            else:
                self.next_check = env_steps + self.recheck_steps
        if self.hold and env_steps >= self.next_curve:
            ev = ev or self._evaluate(evaluate)
            self.curve.append({"env_steps": env_steps, "train_seconds": round(now, 3),
                               "window_mean": None if window_mean is None else round(window_mean, 2), **ev})
            while self.next_curve <= env_steps:
                self.next_curve += self.curve_every
        if self.solved_seconds is not None and not self.hold:
            self.stop_reason = "solved"
        elif env_steps >= self.budget_steps:
            self.stop_reason = "budget_steps"
        elif now >= self.budget_seconds:
            self.stop_reason = "budget_seconds"
        return self.stop_reason is not None

    def finish(self, evaluate: Callable[[], dict[str, Any]] | None, clock: float | None = None) -> None:
        """Hold mode: one last evaluation at the end of the budget (unless the curve has it already)."""
        if self.hold and evaluate is not None and (not self.curve or self.curve[-1]["env_steps"] != self.env_steps):
            now = self.last_now if clock is not None else self.train_seconds()
            ev = self._evaluate(evaluate)
            self.curve.append({"env_steps": self.env_steps, "train_seconds": round(now, 3),
                               "window_mean": None if self.window_mean is None else round(self.window_mean, 2), **ev})

    def record(self, clock: float | None = None) -> dict[str, Any]:
        out = {
            "solved": self.solved_seconds is not None,
            "time_to_solve_seconds": None if self.solved_seconds is None else round(self.solved_seconds, 3),
            "env_steps_to_solve": self.solved_steps,
            "stop_reason": self.stop_reason,
            "env_steps_total": self.env_steps,
            "train_seconds_total": round(self.last_now if clock is not None else self.train_seconds(), 3),
            "eval_seconds_total": round(self.eval_seconds, 3),
            "final_window_mean": None if self.window_mean is None else round(self.window_mean, 2),
            "solve_checks": self.checks,
        }
        if self.hold:
            out["eval_curve"] = self.curve
            reached = [i for i, p in enumerate(self.curve) if p["mean_return"] >= TARGET]
            after = self.curve[reached[0]:] if reached else []
            out["hold"] = {
                "first_eval_at_target_steps": self.curve[reached[0]]["env_steps"] if reached else None,
                "final_eval": self.curve[-1]["mean_return"] if self.curve else None,
                "min_eval_after_reaching": min(p["mean_return"] for p in after) if after else None,
                "held_to_end": bool(after) and all(p["mean_return"] >= TARGET for p in after),
            }
        return out


def emit(result: dict[str, Any]) -> None:
    """The one line the driver (bench_cartpole.py) reads from a contender's stdout."""
    result.setdefault("loadavg_end", [round(x, 2) for x in os.getloadavg()])
    print(RESULT_PREFIX + json.dumps(result), flush=True)

"""Seeding shared by the numpy-batched envs."""

from __future__ import annotations


def per_env_seeds(seed: int | list[int | None], num_envs: int) -> list[int | None]:
    """One seed per copy, as gymnasium's SyncVectorEnv seeds its copies: `seed + i` for an int, else
    the list as given (its length must be `num_envs`)."""
    seeds = [seed + i for i in range(num_envs)] if isinstance(seed, int) else list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"{len(seeds)} seeds given for {num_envs} envs")
    return seeds

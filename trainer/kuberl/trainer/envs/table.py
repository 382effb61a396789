"""Generate the operator's table of registered environments (`kuberl/api/registered_envs.json`).

The operator checks a job's environment against this table instead of building it (its process must
never run what a spec names, and building even a registered env with a tenant's kwargs has no bound
in time or memory). Each row: the action and observation spaces at default kwargs, and the keyword
arguments the constructor takes. Ids whose dependencies are not installed here (Box2D, MuJoCo,
Atari, JAX) are rows without spaces: the operator knows the id, the learner pod checks the rest.

    python -m kuberl.trainer.envs.table            # rewrite the table
    python -m kuberl.trainer.envs.table --check    # exit 1 if the committed table is stale (tests)
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import sys
import warnings
from importlib import resources
from typing import Any

import gymnasium as gym

from kuberl.api.semantics import TABLE_RESOURCE
from kuberl.trainer.envs import ENV_IDS, env_config_class
from kuberl.trainer.envs.resolve import describe_space


def _params(env_id: str, entry: Any) -> list[str] | None:
    if env_id in ENV_IDS:  # KubeRL's envs take their config dataclass's fields as **kwargs
        import dataclasses

        return sorted(f.name for f in dataclasses.fields(env_config_class(env_id)))
    try:
        signature = inspect.signature(entry)
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return sorted(name for name, p in signature.parameters.items()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self")


def _row(env_id: str) -> dict[str, Any]:
    spec = gym.spec(env_id)
    row: dict[str, Any] = {"action": None, "observation": None, "params": None}
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            entry = spec.entry_point if callable(spec.entry_point) else gym.envs.registration.load_env_creator(
                spec.entry_point)
            env = gym.make(env_id)
    except Exception:  # noqa: BLE001 - its extra dependencies are not installed: the learner checks it
        return row
    try:
        row["action"] = describe_space(env.action_space).to_json()
        row["observation"] = describe_space(env.observation_space).to_json()
    finally:
        env.close()
    params = _params(env_id, entry)
    row["params"] = sorted(set(params) | set(spec.kwargs)) if params is not None else None
    return row


def build_table() -> dict[str, Any]:
    envs = {env_id: _row(env_id) for env_id in sorted(gym.registry)}
    return {"generatedBy": "python -m kuberl.trainer.envs.table", "gymnasium": gym.__version__, "envs": envs}


def render(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed table differs")
    args = parser.parse_args(argv)
    target = resources.files("kuberl.api").joinpath(TABLE_RESOURCE)
    text = render(build_table())
    if args.check:
        current = target.read_text() if target.is_file() else ""
        if current != text:
            print(f"{target} is stale: run python -m kuberl.trainer.envs.table", file=sys.stderr)
            return 1
        return 0
    with resources.as_file(target) as path:
        path.write_text(text)
    print(f"wrote {target} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

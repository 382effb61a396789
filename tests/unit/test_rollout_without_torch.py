"""The Ray head and the rollout workers run the rollout image, which has no torch (nor SciPy, Optuna or
tensorboardX): what a rollout worker does for each example job (build its envs, load the learner's weights,
act with the algorithm's numpy policy, collect a batch, play greedy evaluation episodes, and Tic-Tac-Toe's
games against an opponent) runs here with those packages unimportable, in a process of its own.

The learner's side (the algorithm, its policy config and weights) is built in this process, with torch, and
handed over pickled, as Ray hands it to a worker. Dockerfile.rollout checks the imports when it builds; the
end-to-end tests run every cluster job's workers on that image.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from kuberl.api.load import load_job_file
from kuberl.operator.names import DEFAULT_TRAINER_IMAGE
from kuberl.trainer.algorithms import algorithm_for
from kuberl.trainer.rollout import env_spaces
from kuberl.trainer.spaces import space_info
from tools import REPO

NOT_IN_THE_ROLLOUT_IMAGE = ("torch", "scipy", "optuna", "tensorboardX")

_WORKER = """
import importlib.abc, pickle, sys

class NotInTheRolloutImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed in the rollout image")

sys.meta_path.insert(0, NotInTheRolloutImage())
from kuberl.trainer.rollout import RolloutWorker

with open(sys.argv[1], "rb") as handle:
    cases = pickle.load(handle)
for case in cases:
    worker = RolloutWorker(**case["args"])
    assert worker.env_problem is None, worker.env_problem
    weights = case["weights"]
    if case["on_policy"]:
        batch = worker.sample_onpolicy(weights, 1, 32, 0.99)
    else:
        batch = worker.sample_offpolicy(weights, 1, 32, 0.5, 0.99, case["n_step"])
    worker.evaluate(None, 1, [1, 2])
    if case["games"]:
        from kuberl.trainer.evaluation.opponent import _worker_games
        games = _worker_games(worker, weights, 1, "random", True, 4, 0)
        assert games, games
    worker.close()
    print(case["name"], len(batch["rewards"]))
assert not [m for m in sys.modules if m.split(".")[0] in {blocked!r}]
print("ok")
"""


def _case(example: str) -> dict:
    job = load_job_file(REPO / "examples" / example)
    spec = job.spec
    info = space_info(*env_spaces(spec.environment))
    multi_agent = spec.environment.multi_agent
    algo = algorithm_for(spec, info, torch.device("cpu"), seed=0, total_env_steps=10_000)
    return {"name": example, "on_policy": algo.on_policy, "n_step": getattr(algo, "n_step", 1),
            "games": example.startswith("tictactoe"), "weights": algo.weights(),
            "args": {"env_id": spec.environment.id, "env_kwargs": spec.environment.kwargs, "num_envs": 2, "seed": 3,
                     "policy": algo.policy_config(), "max_episode_steps": spec.environment.max_episode_steps,
                     "record_steps": algo.records_steps,
                     "multi_agent": None if multi_agent is None else multi_agent.model_dump()}}


def _image(example: str) -> str | None:
    return load_job_file(REPO / "examples" / example).spec.image


ALL_EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
#: An example naming its image runs it in every pod, the workers' too: not the rollout image.
EXAMPLES = [example for example in ALL_EXAMPLES if _image(example) is None]


def test_an_example_naming_an_image_names_the_trainer_image():
    """Its environment needs more than the rollout image holds (MPE's pygame and SciPy, PettingZoo's classic
    games' pygame): the trainer image has it, so the example runs on a cluster as it is."""
    named = {example: _image(example) for example in ALL_EXAMPLES if _image(example) is not None}
    assert named == {"spread-ppo.yaml": DEFAULT_TRAINER_IMAGE, "tictactoe-selfplay-dqn.yaml": DEFAULT_TRAINER_IMAGE,
                     "adversary-ppo-groups.yaml": DEFAULT_TRAINER_IMAGE}


@pytest.mark.parametrize("example", EXAMPLES)
def test_a_rollout_worker_runs_each_example_without_torch(example, tmp_path):
    cases = tmp_path / "cases.pkl"
    cases.write_bytes(pickle.dumps([_case(example)]))
    result = subprocess.run([sys.executable, "-c", _WORKER.format(blocked=NOT_IN_THE_ROLLOUT_IMAGE), str(cases)],
                            cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-4000:]
    name, steps = result.stdout.splitlines()[0].split()
    assert name == example and int(steps) > 0, result.stdout


def test_the_rollout_extra_needs_no_torch():
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    rollout = " ".join([*pyproject["project"]["dependencies"], *extras["rollout"]])
    assert not any(package in rollout for package in ("torch", "kuberl[", "tensorboard")), rollout
    assert "kuberl[sweep,rollout]" in extras["trainer"], "the learner's image holds what the workers' does"

"""BDQ's preference-alignment head: trajectory segments cut from what the rollout workers
record (`steps.py`), a synthetic teacher from the spec's constraints (`teacher.py`), ranked pairs
from people in a JSONL file re-read while training (`pairs_file.py`, the learner's side in
`people.py`, the `kuberl preferences` command in `ranking.py`), the Bradley-Terry head on the shared
trunk (`head.py`) and the glue BDQ calls (`aligner.py`).

`steps`, `pairs_file` and `ranking` import numpy only (rollout workers and the CLI use them); the
others import torch.
"""

"""BDQ's preference-alignment head (issue 18): trajectory segments cut from what the rollout workers
record (`steps.py`), a synthetic teacher from the spec's constraints (`teacher.py`), ranked pairs
from people in a JSONL file re-read while training (`pairs_file.py`), the Bradley-Terry head on the
shared trunk (`head.py`) and the glue BDQ calls (`aligner.py`).

This package's `steps` and `pairs_file` modules import numpy only (rollout workers and the CLI use
them); `head` and `aligner` import torch.
"""

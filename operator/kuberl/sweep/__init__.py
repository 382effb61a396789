"""Sweeps: the search, early-stopping and ranking decisions of an RLSweep, for `kuberl sweep` and the operator
alike. Nothing here imports torch or Ray: `engine` asks Optuna, `statistics` asks SciPy."""

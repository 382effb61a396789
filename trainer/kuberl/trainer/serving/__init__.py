"""Serving trained policies: export a checkpoint to a self-contained artifact, answer requests from it.

`artifact.py` loads an exported policy and acts greedily with numpy (no torch); `export.py` writes the
artifact from a run directory (torch); `server.py` is the HTTP server (Open Inference Protocol + /act).
"""

"""An exported policy: `policy.json` (spaces, mask convention, network shape) + `weights.npz`, acting
greedily with the same numpy code the rollout workers run. Imports numpy (and spaces.py) only: no torch.

Observations arrive as the environment gives them (a Box's floats, a Discrete's index, a Dict's parts by
key) and are checked against the exported space before they reach the network: a wrong shape, a wrong
dtype, NaN or a value outside the space raises `BadInput` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kuberl.trainer.spaces import SpaceInfo

FORMAT = "kuberl-policy/1"
MANIFEST = "policy.json"
WEIGHTS = "weights.npz"
MASK_INPUT = "action_mask"


class BadInput(ValueError):
    """A request the policy cannot answer; `field` names the part of the request that is wrong."""

    status = 400  # the HTTP status the server answers with; subclasses for 404 and 413

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float as the string "Infinity", "-Infinity" or "NaN": strict JSON
    (RFC 8259) has no such numbers, and Python's float(), numpy, JavaScript's Number() and Go's
    strconv.ParseFloat all read these strings back."""
    if isinstance(value, float) and not np.isfinite(value):
        return "NaN" if np.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class Part:
    """One named input of the policy (the whole observation, or one key of a Dict observation)."""

    name: str
    space: dict[str, Any]  # {"type": Box|Discrete|MultiDiscrete|MultiBinary, ...} as export.describe_space writes it

    @property
    def shape(self) -> list[int]:
        kind = self.space["type"]
        if kind == "Discrete":
            return []
        if kind == "MultiDiscrete":
            return [len(self.space["nvec"])]
        return list(self.space["shape"])

    @property
    def datatype(self) -> str:
        return "FP32" if self.space["type"] == "Box" else "INT64"

    def encode(self, value: Any, batch: int, field: str) -> np.ndarray:
        """Check `value` ([batch, *shape]) against the space; the float32 rows the network reads."""
        arr = _as_array(value, field)
        want = [batch, *self.shape]
        if self.space["type"] == "Discrete" and arr.shape == (batch, 1):
            arr = arr.reshape(batch)
        if list(arr.shape) != want:
            raise BadInput(field, f"shape {list(arr.shape)} does not match the observation space's "
                                  f"{want} ([batch, *{self.shape}])")
        kind = self.space["type"]
        if kind == "Box":
            if arr.dtype.kind not in "fiu":
                raise BadInput(field, f"dtype {arr.dtype} is not a number; {self.name} is float32")
            x = arr.astype(np.float32)
            bad = ~np.isfinite(x)
            if bad.any():
                idx = _first(bad)
                raise BadInput(field, f"element {idx} is {arr[idx]}: observations must be finite numbers")
            low, high = self._bounds()
            outside = (x < low) | (x > high)
            if outside.any():
                idx = _first(outside)
                j = idx[1:]
                raise BadInput(field, f"element {idx} = {float(x[idx])} is outside the observation space "
                                      f"[{float(low[j])}, {float(high[j])}]" + self._name_of(j))
            return x.reshape(batch, -1)
        if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(np.isfinite(arr))
                                               and np.all(arr == np.round(arr))):
            raise BadInput(field, f"dtype {arr.dtype} is not an integer; {self.name} is a {kind} space")
        ints = arr.astype(np.int64)
        if kind == "Discrete":
            start, n = int(self.space.get("start", 0)), int(self.space["n"])
            outside = (ints < start) | (ints >= start + n)
            if outside.any():
                idx = _first(outside)
                raise BadInput(field, f"element {idx} = {int(ints[idx])} is outside Discrete({n}, start={start})")
            out = np.zeros((batch, n), np.float32)
            out[np.arange(batch), ints - start] = 1.0
            return out
        if kind == "MultiBinary":
            outside = (ints < 0) | (ints > 1)
            if outside.any():
                idx = _first(outside)
                raise BadInput(field, f"element {idx} = {int(ints[idx])} is not 0 or 1 (MultiBinary)")
            return ints.reshape(batch, -1).astype(np.float32)
        nvec = np.asarray(self.space["nvec"], np.int64)
        outside = (ints < 0) | (ints >= nvec)
        if outside.any():
            idx = _first(outside)
            raise BadInput(field, f"element {idx} = {int(ints[idx])} is outside [0, {int(nvec[idx[1]]) - 1}]")
        cols = []
        for j, n in enumerate(nvec):
            col = np.zeros((batch, int(n)), np.float32)
            col[np.arange(batch), ints[:, j]] = 1.0
            cols.append(col)
        return np.concatenate(cols, axis=1)

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if "_low" not in self.__dict__:
            shape = self.shape
            low = np.asarray(self.space["low"], np.float64).reshape(shape).astype(np.float32)
            high = np.asarray(self.space["high"], np.float64).reshape(shape).astype(np.float32)
            object.__setattr__(self, "_low", low)
            object.__setattr__(self, "_high", high)
        return self.__dict__["_low"], self.__dict__["_high"]

    def _name_of(self, index: tuple) -> str:
        names = self.space.get("names")
        if names and len(index) == 1:
            return f" ({names[index[0]]})"
        return ""


def _as_array(value: Any, field: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as err:  # ragged nested lists
        raise BadInput(field, f"is not a rectangular array of numbers ({err})") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise BadInput(field, f"is not a rectangular array of numbers (got {type(value).__name__} "
                              f"with dtype {arr.dtype})")
    return arr


def _first(mask: np.ndarray) -> tuple:
    return tuple(int(i) for i in np.argwhere(mask)[0])


class ExportedPolicy:
    """A policy loaded from an artifact directory: `act(inputs, mask)` returns greedy actions."""

    def __init__(self, manifest: dict[str, Any], weights: dict[str, np.ndarray], source: Path | None = None):
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{source or 'artifact'}: format {manifest.get('format')!r} is not {FORMAT!r}")
        self.manifest = json_safe(manifest)  # what model metadata prints, whether loaded or built in memory
        self.source = source
        self.name = manifest["name"]
        self.info = _space_info(manifest["space_info"])
        obs = self.manifest["observation"]
        if obs["type"] == "Dict":
            self.parts = [Part(key, sub) for key, sub in obs["spaces"].items()]
        else:
            self.parts = [Part("observation", obs)]
        self.mask_size = manifest["action_mask"]["size"] if manifest.get("action_mask") else None
        self.policy = _make_policy(self.info, manifest["policy"])
        self.policy.load(weights)

    @classmethod
    def load(cls, path: str | Path) -> ExportedPolicy:
        path = Path(path)
        directory = path if path.is_dir() else path.parent
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{directory} is not an exported policy: {MANIFEST} is missing "
                                    "(make one with `kuberl export RUN_DIR`)")
        manifest = json.loads(manifest_path.read_text())
        with np.load(directory / manifest["files"]["weights"], allow_pickle=False) as npz:
            weights = {k: npz[k] for k in npz.files}
        return cls(manifest, weights, directory)

    # ---- acting --------------------------------------------------------------------------------

    def encode(self, inputs: dict[str, Any], batch: int, prefix: str = "") -> np.ndarray:
        """Named observation parts -> float32 [batch, obs_dim], checked against the space."""
        if len(self.parts) == 1:
            return self.parts[0].encode(inputs[self.parts[0].name], batch, prefix + self.parts[0].name)
        return np.concatenate([p.encode(inputs[p.name], batch, prefix + p.name) for p in self.parts], axis=1)

    def check_mask(self, mask: Any, batch: int, field: str) -> np.ndarray:
        if self.mask_size is None:
            raise BadInput(field, "this policy takes no action mask (its environment gives none)")
        arr = _as_array(mask, field)
        if list(arr.shape) != [batch, self.mask_size]:
            raise BadInput(field, f"shape {list(arr.shape)} does not match [batch, {self.mask_size}]")
        if arr.dtype.kind not in "biu" or (arr.dtype.kind != "b" and ((arr < 0) | (arr > 1)).any()):
            raise BadInput(field, f"must be booleans (or 0/1); got dtype {arr.dtype}")
        arr = arr.astype(bool)
        if not arr.any(axis=1).all():
            raise BadInput(field, f"row {int(np.argmin(arr.any(axis=1)))} allows no action")
        return arr

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Greedy actions for float32 [batch, obs_dim] rows: [batch] (Discrete), [batch, k]
        (MultiDiscrete), or float32 [batch, *shape] clipped to the bounds (Box)."""
        actions = self.policy.greedy(obs, mask)  # every policy's draw-free action
        if self.info.action_kind == "Box":
            shape = self.info.action_dims
            low = np.asarray(self.info.action_low, np.float32).reshape(shape)
            high = np.asarray(self.info.action_high, np.float32).reshape(shape)
            return np.clip(actions.reshape(-1, *shape), low, high).astype(np.float32)
        return actions.astype(np.int64)

    # ---- description ---------------------------------------------------------------------------

    def inputs(self) -> list[dict[str, Any]]:
        """Open Inference Protocol tensor metadata of the inputs (batch dimension -1)."""
        out = [{"name": p.name, "datatype": p.datatype, "shape": [-1, *p.shape]} for p in self.parts]
        if self.mask_size is not None:
            out.append({"name": MASK_INPUT, "datatype": "BOOL", "shape": [-1, self.mask_size]})
        return out

    def outputs(self) -> list[dict[str, Any]]:
        kind = self.info.action_kind
        if kind == "Discrete":
            return [{"name": "action", "datatype": "INT64", "shape": [-1]}]
        if kind == "MultiDiscrete":
            return [{"name": "action", "datatype": "INT64", "shape": [-1, len(self.info.action_dims)]}]
        return [{"name": "action", "datatype": "FP32", "shape": [-1, *self.info.action_dims]}]


def _space_info(d: dict[str, Any]) -> SpaceInfo:
    return SpaceInfo(
        obs_dim=int(d["obs_dim"]), obs_parts=tuple((k, int(w)) for k, w in d["obs_parts"]),
        action_kind=d["action_kind"], action_dims=tuple(int(x) for x in d["action_dims"]),
        action_low=tuple(float(x) for x in d["action_low"]), action_high=tuple(float(x) for x in d["action_high"]),
        obs_discrete_n=d["obs_discrete_n"], obs_low=tuple(float(x) for x in d["obs_low"]),
        obs_high=tuple(float(x) for x in d["obs_high"]),
    )


def _make_policy(info: SpaceInfo, cfg: dict[str, Any]):
    """The same numpy policy classes a rollout worker builds for this config."""
    from kuberl.trainer.policies import make_policy

    return make_policy(info, cfg)

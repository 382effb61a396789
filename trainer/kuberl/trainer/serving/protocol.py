"""What `kuberl serve` reads and writes: request bodies within limits (size, nesting depth, strict JSON),
the Open Inference Protocol's infer request and response with Triton's binary tensor data extension,
and `/act`'s plain JSON. A malformed request raises `BadInput` naming its field (a 400; 413 when too
large); responses are strict JSON (RFC 8259: no NaN or Infinity), which browsers and Go can parse.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from kuberl.trainer.serving.artifact import MASK_INPUT, BadInput, ExportedPolicy

MAX_BODY_BYTES = 16 * 1024 * 1024
#: Deepest JSON nesting a request may have. A Dict observation of images in a batched /act request
#: nests 6 levels; Python's parser recurses once per level, so 100,000 levels raise RecursionError.
MAX_DEPTH = 32
#: The binary tensor data extension's header: the length of the JSON that precedes the tensor bytes.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: OIP datatype -> (numpy kinds its JSON data may hold, its binary layout: little-endian, row-major)
DATATYPES = {"FP32": ("fiu", "<f4"), "INT64": ("iu", "<i8"), "BOOL": ("biu", "u1")}


class NotServed(BadInput):
    """A model or version this server does not serve."""

    status = 404


class TooLarge(BadInput):
    """A body over the size limit."""

    status = 413


def dumps(value: Any) -> str:
    """Strict JSON: a non-finite float raises here instead of going out as `NaN` or `-Infinity`, which
    JavaScript's JSON.parse and Go's encoding/json reject (artifact.json_safe spells them as strings)."""
    return json.dumps(value, allow_nan=False)


# ---- bodies ------------------------------------------------------------------------------------------


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge("body", f"Content-Length {request.content_length} exceeds this server's limit of "
                               f"{limit} bytes")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:  # a chunked body has no Content-Length to check up front
        raise TooLarge("body", f"is larger than this server's limit of {limit} bytes") from None


_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash and the byte it escapes (only inside strings)
_STRING = re.compile(rb'"[^"]*"')  # a string once its escapes are gone
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # as int8: +1 opens a level, -1 closes one
_CONSTANT = re.compile(rb'"(?:[^"\\]++|\\.)*+"|(-?Infinity|NaN)', re.DOTALL)  # the token outside strings


def check_depth(raw: bytes, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than `limit` before parsing it (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # cannot nest deeper than it has brackets: the common case costs two scans
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    brackets = _STRING.sub(b"", raw.translate(None, _NOT_STRUCTURE)).translate(_STEP, b'"')
    depth = int(np.cumsum(np.frombuffer(brackets, np.int8), dtype=np.int32).max(initial=0))
    if depth > limit:
        raise BadInput("body", f"nests {depth} levels deep; this server allows at most {limit}")


class _NotANumber(Exception):
    """Python's parser met NaN or Infinity, which it reads by default and JSON does not have."""


def _not_a_number(name: str):
    raise _NotANumber(name)


_DECODER = json.JSONDecoder(parse_constant=_not_a_number)  # built once: json.loads(..., hook) builds one a call


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request's JSON object, strictly: no NaN or Infinity, at most MAX_DEPTH levels."""
    check_depth(raw)
    try:
        body = _DECODER.decode(raw.decode())  # RFC 8259: JSON between systems is UTF-8
    except _NotANumber as err:
        at = next((f" at byte {m.start(1)}" for m in _CONSTANT.finditer(raw) if m.group(1)), "")  # outside strings
        raise BadInput("body", f"{err}{at} is not a JSON number (RFC 8259); observations must be finite "
                               "numbers") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4,300 digits
        raise BadInput("body", f"is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise BadInput("body", f"must be a JSON object, got {type(body).__name__}")
    return body


def split_binary(raw: bytes, header_length: str | None) -> tuple[bytes, memoryview | None]:
    """(the JSON header, the binary tensor data after it); no binary data without the header."""
    if header_length is None:
        return raw, None
    if not (header_length.isascii() and header_length.isdigit()) or int(header_length) > len(raw):
        raise BadInput(HEADER_LENGTH, f"{header_length!r} is not a length within the body's {len(raw)} bytes")
    n = int(header_length)
    return raw[:n], memoryview(raw)[n:]


# ---- the Open Inference Protocol ---------------------------------------------------------------------


@dataclass
class InferRequest:
    batch: int
    inputs: dict[str, np.ndarray]  # observation parts by name, [batch, *shape]
    mask: np.ndarray | None
    binary_output: bool  # answer with the binary tensor data extension


class _BinaryData:
    """The tensor bytes after the JSON header, taken by the inputs in their order."""

    def __init__(self, data: memoryview | None):
        self.data, self.offset = data, 0

    def take(self, size: Any, shape: list[int], datatype: str, field: str) -> np.ndarray:
        if self.data is None:
            raise BadInput(field, f"binary data needs the {HEADER_LENGTH} header (the JSON's length in bytes)")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadInput(field, f"must be a non-negative integer, got {size!r}")
        layout = np.dtype(DATATYPES[datatype][1])
        count = math.prod(shape)
        if size != count * layout.itemsize:
            raise BadInput(field, f"{size} bytes do not hold shape {shape} of {datatype} "
                                  f"({count * layout.itemsize} bytes)")
        left = len(self.data) - self.offset
        if size > left:
            raise BadInput(field, f"{size} bytes, but only {left} bytes of binary data follow the JSON header "
                                  f"and the inputs before")
        arr = np.frombuffer(self.data, layout, count=count, offset=self.offset).reshape(shape)
        self.offset += size
        return arr

    def check_all_taken(self) -> None:
        if self.data is not None and self.offset != len(self.data):
            raise BadInput("body", f"{len(self.data) - self.offset} bytes after the JSON header belong to no input "
                                   f"(the inputs' binary_data_size add up to {self.offset})")


def _shape(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in value):
        raise BadInput(field, f"must be a list of non-negative integers, got {value!r}")
    return value


def _parameters(holder: dict[str, Any], field: str) -> dict[str, Any]:
    """`holder`'s parameters (field: where `holder` is, "" for the request itself)."""
    params = holder.get("parameters", {})
    where = f"{field}.parameters" if field else "parameters"
    if not isinstance(params, dict):
        raise BadInput(where, f"must be an object, got {type(params).__name__}")
    shared = [k for k in params if k.startswith("shared_memory")]
    if shared:
        raise BadInput(f"{where}.{shared[0]}", "the shared-memory extension is not supported: send the tensor "
                                               "in the body, as JSON or binary data")
    return params


def _flag(params: dict[str, Any], key: str, default: bool, field: str) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise BadInput(f"{field}.parameters.{key}" if field else f"parameters.{key}",
                       f"must be true or false, got {value!r}")
    return value


def _input_tensor(tensor: Any, field: str, expected: dict[str, dict], binary: _BinaryData) -> tuple[str, np.ndarray]:
    """One $request_input -> (name, array of its shape), from JSON `data` or binary data."""
    if not isinstance(tensor, dict):
        raise BadInput(field, "must be an object with name, shape, datatype and data")
    name = tensor.get("name")
    if not isinstance(name, str) or name not in expected:
        raise BadInput(f"{field}.name", f"{name!r} is not an input of this model; its inputs: {', '.join(expected)}")
    want = expected[name]
    shape = _shape(tensor.get("shape"), f"{field}.shape")
    datatype = tensor.get("datatype")
    if datatype != want["datatype"]:
        raise BadInput(f"{field}.datatype", f"{datatype!r} does not match the model's {want['datatype']} for {name!r}")
    params = _parameters(tensor, field)
    if "binary_data_size" in params:
        if "data" in tensor:
            raise BadInput(f"{field}.data", "is given as well as parameters.binary_data_size: send the tensor once")
        data = binary.take(params["binary_data_size"], shape, datatype, f"{field}.parameters.binary_data_size")
    elif "data" not in tensor:
        raise BadInput(f"{field}.data", "is missing (or give parameters.binary_data_size and binary data)")
    else:
        data = _numbers(tensor["data"], datatype, f"{field}.data")
        if data.size != math.prod(shape):
            raise BadInput(f"{field}.data", f"holds {data.size} values; shape {shape} needs {math.prod(shape)}")
    if len(shape) != len(want["shape"]) or any(w != -1 and w != s for w, s in zip(want["shape"], shape, strict=False)):
        raise BadInput(f"{field}.shape", f"{shape} does not match the model's {want['shape']} for {name!r} "
                                         "(-1: any batch size)")
    return name, data.reshape(shape)


def _numbers(data: Any, datatype: str, field: str) -> np.ndarray:
    if not isinstance(data, list):
        raise BadInput(field, f"must be a list of numbers, got {type(data).__name__}")
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        raise BadInput(field, "is not a rectangular list of numbers") from None
    if arr.dtype == object or arr.dtype.kind not in DATATYPES[datatype][0]:
        raise BadInput(field, f"values of type {arr.dtype} (e.g. {arr.ravel()[:1].tolist()}) are not {datatype}")
    if datatype != "BOOL" and arr.dtype.kind == "b":
        raise BadInput(field, f"booleans are not {datatype}")
    return arr


def _binary_output(body: dict[str, Any]) -> bool:
    """Whether the client asked for binary output: `binary_data` on the output, else the request's
    `binary_data_output`, else JSON."""
    binary = _flag(_parameters(body, ""), "binary_data_output", False, "")
    outputs = body.get("outputs")
    if outputs is None:
        return binary
    if not isinstance(outputs, list) or not all(isinstance(o, (str, dict)) for o in outputs):
        raise BadInput("outputs", f"must be a list of {{\"name\": \"action\"}} objects, got {outputs!r}")
    for j, out in enumerate(outputs):
        name = out.get("name") if isinstance(out, dict) else out
        if name != "action":
            raise BadInput("outputs", f"this model has one output, 'action'; asked for {name!r}")
        if isinstance(out, dict):
            params = _parameters(out, f"outputs[{j}]")
            if "classification" in params:
                raise BadInput(f"outputs[{j}].parameters.classification", "is not supported: 'action' is the "
                                                                          "greedy action already")
            binary = _flag(params, "binary_data", binary, f"outputs[{j}]")
    return binary


def parse_infer(policy: ExportedPolicy, body: dict[str, Any], binary: memoryview | None = None) -> InferRequest:
    """An OIP infer request (its JSON, and the binary data after it) -> checked names, shapes, datatypes."""
    expected = {spec["name"]: spec for spec in policy.inputs()}
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadInput("inputs", f"must be a non-empty list of tensors; this model's inputs: {', '.join(expected)}")
    data = _BinaryData(binary)
    arrays: dict[str, np.ndarray] = {}
    batch = None
    for i, tensor in enumerate(inputs):
        name, arr = _input_tensor(tensor, f"inputs[{i}]", expected, data)
        if name in arrays:
            raise BadInput(f"inputs[{i}].name", f"{name!r} is given twice")
        if batch is not None and arr.shape[0] != batch:
            raise BadInput(f"inputs[{i}].shape", f"batch size {arr.shape[0]} differs from the other inputs' {batch}")
        batch = arr.shape[0]
        arrays[name] = arr
    data.check_all_taken()
    missing = [n for n in expected if n != MASK_INPUT and n not in arrays]
    if missing:
        raise BadInput("inputs", f"missing input(s) {', '.join(missing)}")
    if batch == 0:
        raise BadInput("inputs[0].shape", "batch size 0: send at least one observation")
    if not isinstance(body.get("id", ""), str):  # echoed back: a number could be 1e999, infinite
        raise BadInput("id", f"must be a string, got {body['id']!r}")
    binary_output = _binary_output(body)
    mask = policy.check_mask(arrays.pop(MASK_INPUT), batch, MASK_INPUT) if MASK_INPUT in arrays else None
    return InferRequest(batch, arrays, mask, binary_output)


def infer_response(model: dict[str, str], request: InferRequest, actions: np.ndarray, datatype: str,
                   request_id: Any = None) -> web.Response:
    """The OIP infer response: `action` as JSON data, or as binary data after the JSON header."""
    output: dict[str, Any] = {"name": "action", "datatype": datatype, "shape": [request.batch, *actions.shape[1:]]}
    answer: dict[str, Any] = {**model, "outputs": [output]}
    if request_id is not None:
        answer["id"] = request_id
    if not request.binary_output:
        output["data"] = actions.ravel().tolist()
        return web.Response(text=dumps(answer), content_type="application/json")
    raw = np.ascontiguousarray(actions, DATATYPES[datatype][1]).tobytes()
    output["parameters"] = {"binary_data_size": len(raw)}
    header = dumps(answer).encode()
    return web.Response(body=header + raw, content_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(len(header))})


# ---- /act ----------------------------------------------------------------------------------------------


def parse_act(policy: ExportedPolicy, body: dict[str, Any]) -> tuple[int, dict[str, Any], Any, bool]:
    """A /act request -> (batch, observation parts, mask, batched?)."""
    if ("observation" in body) == ("observations" in body):
        raise BadInput("observation", "give either observation (one) or observations (a list)")
    unknown = set(body) - {"observation", "observations", "action_mask"}
    if unknown:
        raise BadInput(min(unknown), "unknown field; /act takes observation or observations, and action_mask")
    batched = "observations" in body
    field = "observations" if batched else "observation"
    rows = body[field] if batched else [body[field]]
    if not isinstance(rows, list) or not rows:
        raise BadInput(field, "must be a non-empty list of observations")
    parts: dict[str, list] = {p.name: [] for p in policy.parts}
    for i, row in enumerate(rows):
        row_field = f"{field}[{i}]" if batched else field
        for name, value in _split(policy, row, row_field).items():
            parts[name].append(value)
    for name, values in parts.items():  # ragged rows: name the first one that differs
        shapes = [np.shape(v) for v in values]
        if len(set(shapes)) > 1:
            i = next(i for i, s in enumerate(shapes) if s != shapes[0])
            raise BadInput(f"{field}[{i}]" + ("" if len(policy.parts) == 1 else f".{name}"),
                           f"shape {list(shapes[i])} differs from the first observation's {list(shapes[0])}")
    mask = body.get("action_mask")
    if mask is not None and not batched:
        mask = [mask]
    return len(rows), parts, mask, batched


def _split(policy: ExportedPolicy, row: Any, field: str) -> dict[str, Any]:
    """One observation -> {part name: value}: a list, a dict by observation name, or a dict by Dict key."""
    if len(policy.parts) > 1:
        if not isinstance(row, dict):
            raise BadInput(field, f"must be an object with keys {', '.join(p.name for p in policy.parts)}")
        extra = set(row) - {p.name for p in policy.parts}
        if extra:
            raise BadInput(f"{field}.{min(extra)}", "is not a key of the observation space")
        missing = [p.name for p in policy.parts if p.name not in row]
        if missing:
            raise BadInput(f"{field}.{missing[0]}", "is missing")
        return {p.name: row[p.name] for p in policy.parts}
    part = policy.parts[0]
    if isinstance(row, dict):
        names = part.space.get("names")
        if not names:
            raise BadInput(field, "must be a list (this observation space has no named dimensions)")
        extra = set(row) - set(names)
        if extra:
            raise BadInput(f"{field}.{min(extra)}", f"is not an observation name; names: {', '.join(names)}")
        missing = [n for n in names if n not in row]
        if missing:
            raise BadInput(f"{field}.{missing[0]}", "is missing")
        return {part.name: [row[n] for n in names]}
    return {part.name: row}

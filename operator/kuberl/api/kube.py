"""Kubernetes' own syntax rules for the job fields that end up in pod manifests.

The API server (or the kubelet, for images) refuses a pod whose quantities, resource names, label
keys and values, volume claim names or image references break these rules. The job model checks
them with these functions, and the CRD carries the same patterns, so a job is refused before any of
its pods exists instead of half-created. Messages say what is allowed; the caller adds the field path.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

# ---- quantities (k8s.io/apimachinery/pkg/api/resource) -------------------------------------------

#: A Kubernetes quantity without a sign (resources are never negative): 500m, 2, 1.5, 4Gi, 1e3.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
)
_SIGNED_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(?P<suffix>([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
)
_BINARY: dict[str, Fraction | int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
                                       "": 1, "k": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
QUANTITY_EXAMPLES = "e.g. 500m, 2, 1.5, 512Mi, 4Gi, 1e3 (suffixes n u m k M G T P E, Ki Mi Gi Ti Pi Ei)"
QUANTITY_MAX_LENGTH = 64


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity; ValueError saying what is allowed when it is not one."""
    match = _SIGNED_QUANTITY.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"is not a Kubernetes quantity ({QUANTITY_EXAMPLES})")
    value = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= _DECIMAL[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > 64:
            raise ValueError(f"is not a Kubernetes quantity: exponent {exponent} is out of range")
        value *= Fraction(10) ** exponent
    return -value if match["sign"] == "-" else value


def check_quantity(text: str) -> str:
    """A non-negative quantity (requests, limits, sizeLimit)."""
    if parse_quantity(text) < 0:
        raise ValueError("must not be negative")
    return text


# ---- resource names (k8s.io/kubernetes/pkg/apis/core/validation) ---------------------------------

STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
HUGEPAGES_PREFIX = "hugepages-"
RESOURCE_NAMES_ALLOWED = (
    "cpu, memory, ephemeral-storage, hugepages-<size> (e.g. hugepages-2Mi) or a domain-qualified "
    "extended resource such as nvidia.com/gpu"
)


def is_extended_resource(name: str) -> bool:
    """Device-plugin resources: only whole units, never overcommitted (requests == limits)."""
    return name not in STANDARD_RESOURCES and not name.startswith(HUGEPAGES_PREFIX)


def check_resource_name(name: str) -> str:
    if name in STANDARD_RESOURCES:
        return name
    if name.startswith(HUGEPAGES_PREFIX):
        try:
            parse_quantity(name[len(HUGEPAGES_PREFIX):])
        except ValueError:
            raise ValueError(f"resource name {name!r}: the page size after hugepages- is not a quantity; "
                             f"allowed: {RESOURCE_NAMES_ALLOWED}") from None
        return name
    if "/" not in name or "kubernetes.io/" in name or not is_qualified_name(name):
        raise ValueError(f"resource name {name!r} is not allowed; allowed: {RESOURCE_NAMES_ALLOWED}")
    return name


# ---- names and labels (k8s.io/apimachinery/pkg/util/validation) ----------------------------------

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: RFC 1035 label: what a Service name must be (starts with a letter).
DNS_1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A label key or resource name: optional DNS-subdomain prefix and '/', then a name of at most 63.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_DNS_1035_LABEL = re.compile(DNS_1035_LABEL_PATTERN)


def is_qualified_name(key: str) -> bool:
    prefix, _, _ = key.rpartition("/")
    return bool(_QUALIFIED_NAME.match(key)) and len(prefix) <= 253


def check_label_key(key: str) -> str:
    if not is_qualified_name(key):
        raise ValueError(
            f"label key {key!r} is not valid: an optional DNS-subdomain prefix and '/', then at most 63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit "
            "(e.g. kubernetes.io/arch, nodepool)")
    return key


def check_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ValueError(
            f"label value {value!r} is not valid: at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit (or empty)")
    return value


def check_dns_subdomain(name: str) -> str:
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ValueError("must be a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit (e.g. checkpoints-cartpole)")
    return name


#: Longest job name: the operator names children `<job>-worker-<index>`, `<job>-metrics`, ... and a
#: Service name or label value holds at most 63 characters.
JOB_NAME_MAX_LENGTH = 40


def check_job_name(name: str) -> str:
    if len(name) > JOB_NAME_MAX_LENGTH or not _DNS_1035_LABEL.match(name):
        raise ValueError(
            f"must be a DNS-1035 label of at most {JOB_NAME_MAX_LENGTH} characters: lowercase letters, "
            "digits and '-', starting with a letter and ending with a letter or digit (the job's pods and "
            "Services are named <name>-head, <name>-worker-<i>, <name>-metrics, which must stay valid)")
    return name


# ---- image references (github.com/distribution/reference) ----------------------------------------

_DOMAIN_COMPONENT = r"([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = _DOMAIN_COMPONENT + r"(\." + _DOMAIN_COMPONENT + r")*(:[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(([._]|__|[-]+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    r"^(" + _DOMAIN + r"/)?" + _PATH_COMPONENT + r"(/" + _PATH_COMPONENT + r")*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_IMAGE = re.compile(IMAGE_PATTERN)


def check_image(ref: str) -> str:
    if not _IMAGE.match(ref):
        raise ValueError(
            "is not an image reference: [registry[:port]/]path[:tag][@sha256:digest] with a lowercase path, "
            "e.g. ghcr.io/kuberl/kuberl-trainer:0.1.0")
    name = ref.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    if len(name) > 255:
        raise ValueError("is not an image reference: the repository name is longer than 255 characters")
    return ref


# ---- ports ---------------------------------------------------------------------------------------

#: Ports Ray listens on in the job's pods (the learner pod runs a raylet too): a metrics port there
#: would fail to bind or shadow Ray. 10002-19999 is Ray's default worker port range.
RAY_PORTS = {6379: "Ray GCS", 6380: "Ray head raylet", 8265: "Ray dashboard", 10001: "Ray client server",
             52365: "Ray dashboard agent"}
RAY_WORKER_PORTS = (10002, 19999)


def is_ray_port(port: int) -> bool:
    """A port Ray takes in every pod of a job (a metrics port there would clash with it)."""
    low, high = RAY_WORKER_PORTS
    return port in RAY_PORTS or low <= port <= high


def ray_port_use(port: int) -> str:
    """What Ray uses `port` for, in words."""
    return f"port {port} is the {RAY_PORTS[port]} port" if port in RAY_PORTS else f"port {port} is a Ray worker port"


# ---- free-form values (env kwargs, baseline params) ----------------------------------------------

def json_problem(value: Any, path: str = "") -> str | None:
    """Why `value` cannot travel as JSON (the API server stores JSON; the learner gets the job as JSON)."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path or 'the value'}: {value} is not a JSON number"
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str):
                return f"{where}: key {key!r} is a {type(key).__name__}; keys must be strings (quote it)"
            if (problem := json_problem(item, where)) is not None:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if (problem := json_problem(item, f"{path}[{i}]")) is not None:
                return problem
        return None
    return (f"{path or 'the value'}: {value!r} is a {type(value).__name__}, not JSON (string, number, boolean, "
            "null, list or mapping); quote it to pass a string")

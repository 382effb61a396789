"""Environment kwargs as frozen dataclasses: an unknown kwarg is an error naming what is allowed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def config_from_kwargs(cls, kwargs: Mapping[str, Any]):
    allowed = tuple(f.name for f in dataclasses.fields(cls))
    for key in kwargs:
        if key not in allowed:
            raise ValueError(f"env kwarg {key!r} is not allowed; allowed kwargs: {', '.join(allowed)}")
    return cls(**kwargs)

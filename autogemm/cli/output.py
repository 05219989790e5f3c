"""What the commands print for programs to read (`--json`): strict JSON, which every parser takes. A
record's figures may be NaN (a cuBLAS record's error, a latency not measured), which Python writes
as a bare `NaN` that strict parsers (jq, JavaScript's JSON.parse, Go's encoding/json) refuse: NaN
and the infinities are written as null."""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None, in lists, tuples and dicts too."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def print_json(value: Any, indent: int | None = 2) -> None:
    print(json.dumps(json_safe(value), indent=indent, allow_nan=False))

"""Reading JSON that autogemm did not necessarily write (cache documents, bundles, recorded tables):
refused, with a ValueError that says why, where it is nested deeper than any document autogemm
writes (checked before parsing: a value nested hundreds deep parses, then makes every later walk
over it, a copy, a listing, an export, fail with RecursionError) or where an object names a key
twice (json.loads silently keeps the last one, so what a reviewer sees is not what is served)."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

# Deeper than any document autogemm writes (a bundle's record's config is 6 levels down), far
# below where Python's recursion limit is reached.
MAX_DEPTH = 64

# Brackets inside strings are text, not nesting. Escapes go first (an escaped quote ends nothing),
# then everything but brackets and quotes (bytes.translate: the scan stays far cheaper than the
# parse); what is left between quotes was inside a string.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'[]{}"'))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), without parsing it."""
    structure = _ESCAPE.sub(b"", text.encode("utf-8", "surrogatepass")).translate(None, _NOT_STRUCTURE)
    brackets = b"".join(structure.split(b'"')[::2])
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _object(pairs: list[tuple[str, object]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"duplicate key {duplicate[:80]!r} in one object")
    return found


def loads(text: str) -> Any:
    """The value of a JSON text; ValueError if it is not JSON, nests deeper than MAX_DEPTH or
    repeats a key in an object."""
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels ({depth}): not a document autogemm writes")
    try:
        return json.loads(text, object_pairs_hook=_object)
    except RecursionError:  # (not reached below MAX_DEPTH; kept so that no caller ever sees one)
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None

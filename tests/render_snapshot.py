"""Records the digests of the rendered kernels that tests/test_render.py compares against
(tests/data/render_snapshot.json). Run it after a template change that is meant to alter kernels,
once the change is checked (for a refactor: the cubins' SASS unchanged), and commit the file:
its diff shows which kernels changed.

    python tests/render_snapshot.py
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from test_render import SNAPSHOT, _snapshot_render  # noqa: E402


def main() -> int:
    if SNAPSHOT.exists():
        keys = sorted(json.loads(SNAPSHOT.read_text()))
    else:  # first recording: the sample of the golden behaviour file
        with gzip.open(HERE / "data" / "golden_behaviour.json.gz", "rt") as stream:
            keys = sorted(json.load(stream)["renders"])
    digests = {key: _snapshot_render(key).digest for key in keys}
    old = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    changed = sorted(k for k in digests if old.get(k) != digests[k])
    SNAPSHOT.write_text(json.dumps(digests, indent=0, sort_keys=True) + "\n")
    families = sorted({k.split("|")[0].split("_")[0] if k.startswith("wmma_") else "simt" for k in changed})
    print(f"{len(digests)} kernels recorded, {len(changed)} changed" + (f" ({', '.join(families)})" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Records the reference that tests/test_golden.py holds the families to
(tests/data/golden_behaviour.json.gz): names, dict forms and check() reasons of a fixed sample of
every shipped space (knob draws, valid samples, seeds, defaults) on 11 problems and three
architectures, hand-made faulty configs, and rendered-source digests.

The reference in the repository was recorded from the code before families became data. Record it
anew only for a change meant to alter names or reasons (say which, and why, in the commit):

    python tests/golden_behaviour.py
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from autogemm.families import VectorWidths, family_for  # noqa: E402
from autogemm.problem import Device, Problem  # noqa: E402
from autogemm.kernels.render import render  # noqa: E402
from autogemm.kernels.space import SearchSpace  # noqa: E402
from samples import KINDS  # noqa: E402
from test_families import REASON_CASES  # noqa: E402

DEVICES = ("sm_90", "sm_80", "sm_75")
RENDER_PROBLEMS = (0, 1, 2, 3, 5, 6)  # indices into problems(): which get render digests


def problems(dtype, compute):
    kw = dict(dtype=dtype, compute=compute)
    out = [Problem.from_layout(4096, 4096, 4096, layout, **kw) for layout in ("nn", "nt", "tn", "tt")]
    out += [Problem.from_layout(255, 257, 1023, "nn", **kw), Problem.from_layout(255, 257, 1023, "tt", **kw),
            Problem(1, 1, 1, **kw), Problem.from_layout(64, 64, 16, "nt", **kw), Problem(32, 32, 65536, **kw),
            Problem(64, 64, 64, batch=40000, **kw), Problem(2**31, 1, 1, **kw)]
    return out


def main() -> int:
    devices = {arch: Device.for_arch(arch) for arch in DEVICES}
    entries, renders = [], {}
    for dtype, compute, space_name in KINDS:
        space = SearchSpace.load(space_name)
        probs = problems(dtype, compute)
        rng = random.Random(13)
        chosen = {}
        while len(chosen) < 120:  # draws of the space's knobs that satisfy its constraints (valid or not)
            config, _ = space.evaluate({k: rng.choice(v) for k, v in space.knobs.items()})
            if config is not None:
                chosen.setdefault(config.name, config)
        for config in [*space.sample(40, probs[0], devices["sm_90"], seed=13), *space.seeds]:
            chosen.setdefault(config.name, config)
        for _, name in family_for(dtype, compute).defaults(probs[0]):
            config = space.config_class.from_name(name)
            chosen.setdefault(config.name, config)
        for index, config in enumerate(chosen.values()):
            reasons = {f"{arch}|{p.key}": config.check(p, device) for arch, device in devices.items() for p in probs}
            entries.append({"space": space_name, "name": config.name, "dict": config.to_dict(), "reasons": reasons})
            for j in RENDER_PROBLEMS:
                p = probs[j]
                if config.check(p, devices["sm_90"]):
                    continue
                renders[f"{config.name}|{p.key}|packed"] = render(config, p).digest
                if index % 3 == 0:
                    renders[f"{config.name}|{p.key}|111"] = render(config, p, VectorWidths(1, 1, 1)).digest
    handmade = [{"name": c.name, "dict": c.to_dict(), "problem": p.key,
                 "device": {**dataclasses.asdict(d), "compute_capability": list(d.compute_capability)},
                 "reasons": c.check(p, d)} for _, c, p, d in REASON_CASES]
    defaults = {f"{d}/{c}": [list(x) for x in family_for(d, c).defaults(Problem(1, 1, 1, dtype=d, compute=c))]
                for d, c, _ in KINDS}
    document = {"handmade": handmade, "devices": list(DEVICES), "configs": entries, "renders": renders,
                "defaults": defaults,
                "problems": {space: [p.key for p in problems(d, c)] for d, c, space in KINDS}}
    with gzip.open(HERE / "data" / "golden_behaviour.json.gz", "wt") as out:
        json.dump(document, out, sort_keys=True)
    print(f"{len(entries)} configs, {len(handmade)} hand-made, {len(renders)} renders recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())

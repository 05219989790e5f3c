"""Child process of test_campaign: runs a campaign of replayed problems (slowly) until it ends or is
interrupted with SIGINT; prints DONE or INTERRUPTED."""

from __future__ import annotations

import sys

from autogemm.campaigns.campaign import run_campaign
from autogemm.campaigns.worker import WorkerSpec
from autogemm.campaigns.file import parse_campaign

from campaign_helpers import SPACE_PATH, ReplayFactory


def main() -> None:
    storage, cache_dir, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    campaign = parse_campaign({
        "campaign": {"name": "interrupted", "storage": storage, "trials": 10, "timeout": 600, "seed": 2,
                     "cache_dir": cache_dir},
        "problems": [{"shapes": [[4096, 4096, 1024], [4096, 4096, 2048]]}]})
    specs = [WorkerSpec(campaign, storage, "W0", None, 1, ReplayFactory(delay), str(SPACE_PATH))]
    try:
        run_campaign(campaign, specs, None)
        print("DONE", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)


if __name__ == "__main__":
    main()

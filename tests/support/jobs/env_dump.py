"""Record the Chamber environment this replica was given (`<out>/attempt<A>-replica<R>.json`), then exit
with the code given (default 0) after an optional sleep."""

import json
import os
import sys
import time
from pathlib import Path

KEYS = (
    "CUDA_VISIBLE_DEVICES", "CHAMBER_JOB_ID", "CHAMBER_ATTEMPT", "CHAMBER_REPLICA", "CHAMBER_REPLICAS",
    "CHAMBER_NODE", "CHAMBER_CHECKPOINT_DIR", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK",
)  # fmt: skip
out = Path(sys.argv[1])
seen = {k: os.environ.get(k) for k in KEYS} | {"pid": os.getpid(), "sid": os.getsid(0)}
path = out / f"attempt{os.environ['CHAMBER_ATTEMPT']}-replica{os.environ['CHAMBER_REPLICA']}.json"
path.write_text(json.dumps(seen))
print(json.dumps(seen), flush=True)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)

"""Print, wait until `<out>/go` exists, print again, and exit with the code given (default 0)."""

import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
replica = os.environ["CHAMBER_REPLICA"]
print(f"replica {replica}: before", flush=True)
while not (out / "go").exists():
    time.sleep(0.05)
print(f"replica {replica}: after", flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)

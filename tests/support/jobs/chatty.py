"""Print `count` numbered lines of `width` characters, `per_s` lines a second, then exit 0."""

import sys
import time

count, width, per_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
for i in range(count):
    print(f"{i:06d} " + "x" * (width - 8), flush=True)
    if per_s:
        time.sleep(1 / per_s)

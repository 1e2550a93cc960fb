"""A preemptible trainer: resumes from `$CHAMBER_CHECKPOINT_DIR/state` when it exists (and finishes), else runs
forever, with a child that ignores SIGTERM. On SIGTERM it writes its checkpoint and notes the time, but keeps
running, so only the SIGKILL after the grace ends it (and its child, as one process group)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
checkpoint = Path(os.environ["CHAMBER_CHECKPOINT_DIR"])
attempt = os.environ["CHAMBER_ATTEMPT"]
state = checkpoint / "state"
seen = {"attempt": attempt, "checkpoint_dir": str(checkpoint), "found": sorted(os.listdir(checkpoint))}
(out / f"trainer-attempt{attempt}.json").write_text(json.dumps(seen))
if state.exists():
    print(f"resumed from {state.read_text()}", flush=True)
    sys.exit(0)
child = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
)
(out / "child.pid").write_text(str(child.pid))


def on_sigterm(signum: int, frame: object) -> None:
    state.write_text("step 42")
    (out / "sigterm.json").write_text(json.dumps({"at": time.time(), "pid": os.getpid()}))
    print("SIGTERM: checkpoint written; not exiting", flush=True)


signal.signal(signal.SIGTERM, on_sigterm)
print("training", flush=True)
while True:
    time.sleep(0.05)

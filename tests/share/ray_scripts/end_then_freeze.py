"""A job that ends, leaving its Ray task unable to say so: its node is to die in between.

    python end_then_freeze.py RUNS

Appends one line to RUNS each time it runs. The first time, it stops (SIGSTOP) the Ray
worker whose task started it (the parent of its tether) and writes that worker's pid in
the line, then exits 0: the job has ended, and the task cannot tell the driver. The test
then kills the node; a retry of the task must not run the job again.
"""

import os
import signal
import sys
from pathlib import Path

runs = Path(sys.argv[1])
first = not runs.exists()
# /proc/PID/stat: "pid (comm) state ppid ...": the tether's parent is the Ray worker
worker = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1])
with open(runs, "a") as f:
    f.write(f"ran {worker if first else 0}\n")
if first:
    os.kill(worker, signal.SIGSTOP)

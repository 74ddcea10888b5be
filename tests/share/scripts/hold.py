"""A stand-in for a training job: holds some memory for a while, optionally growing.

    python hold.py --mib 100 --seconds 2                 # holds 100 MiB for 2 s
    python hold.py --mib 20 --grow-to 400 --seconds 5    # lies: keeps growing to 400 MiB
    python hold.py --mib 20 --grow-to 400 --once         # grows only in its first run
                                                         # (a marker in $MEMFIT_WORKDIR)
"""

import argparse
import os
import time

MIB = 2**20

parser = argparse.ArgumentParser()
parser.add_argument("--mib", type=float, default=100.0)
parser.add_argument("--seconds", type=float, default=2.0)
parser.add_argument("--grow-to", type=float)
parser.add_argument("--step-mib", type=float, default=10.0)
parser.add_argument("--step-seconds", type=float, default=0.05)
parser.add_argument("--once", action="store_true")
parser.add_argument("--exit", type=int, default=0)
args = parser.parse_args()

blocks = [b"\x01" * int(args.mib * MIB)]          # bytes are written: resident at once
grow = args.grow_to is not None
if grow and args.once:
    marker = os.path.join(os.environ.get("MEMFIT_WORKDIR", "."), "grew-once")
    grow = not os.path.exists(marker)
    open(marker, "w").close()
end = time.monotonic() + args.seconds
held = args.mib
while time.monotonic() < end:
    if grow and held < args.grow_to:
        blocks.append(b"\x01" * int(args.step_mib * MIB))
        held += args.step_mib
    time.sleep(args.step_seconds)
print(f"held {held:.0f} MiB for {args.seconds} s", flush=True)
raise SystemExit(args.exit)

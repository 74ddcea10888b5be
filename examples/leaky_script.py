"""A script with a real memory leak, to try `memfit watch` on (about 10 seconds: watch
judges growth on at least 5 s of steady time after the start-up).

Every "epoch" it appends a few MiB to a global list that is never cleared, the way a
training loop that keeps its batches (or its predictions) in a list does.

    memfit watch --workdir runs/leak -- python examples/leaky_script.py
    memfit report runs/leak
"""

import argparse
import time

KEPT = []          # the leak: a global that only grows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs (default: 20)")
    parser.add_argument("--mib", type=int, default=4, help="MiB leaked per epoch (default: 4)")
    parser.add_argument("--seconds", type=float, default=0.5,
                        help="seconds per epoch (default: 0.5)")
    args = parser.parse_args()
    for epoch in range(args.epochs):
        batch = b"x" * (args.mib * 2**20)      # bytes filled in: resident, not just reserved
        KEPT.append(batch)                      # ... and kept forever
        time.sleep(args.seconds)
        print(f"epoch {epoch + 1}/{args.epochs}: holding {len(KEPT) * args.mib} MiB",
              flush=True)


if __name__ == "__main__":
    main()

"""Does a refactoring change what memfit does? Two source trees, the same work, compared.

    git worktree add /tmp/before 0812608
    .venv/bin/python benchmarks/same_behaviour.py /tmp/before/src src            # ~2 min
    .venv/bin/python benchmarks/same_behaviour.py /tmp/before/src src --rounds 5 # + speed

For the speed rounds, give the tree before its C extension too (copy the built
``cwindow*.so`` to where that tree's ``setup.py`` puts it), or it reads without it.

Each tree runs in child processes of its own (``PYTHONPATH``), on the same inputs, in the
same directories (so that plans, which name their path, compare as text):

- **pack**: a 3,000-sample source packed as TFRecord shards (5 shards, a train/val split,
  seed 4) and as ``format="arrays"``: the sha256 of every file written;
- **stream**: two epochs of each reader (the block reader, ``reader="tf"``, the arrays
  reader) under an 8 MiB budget: the sha256 of every batch, and ``ds.memfit_plan``;
- **estimate**: two small models (an MLP, a CNN) under both allocator policies: total,
  low, high, model bytes, ``Estimator.total(96)`` and ``max_batch_size(1 GiB)``;
- with ``--rounds N``: streaming throughput of a 20,000-sample set (32x32x3 float32),
  the two trees' children interleaved, N rounds: the ratio after / before per round and
  its median (a refactoring of the hot path should be ~1.0; the spread is the machine's).

Prints one line per check (``same`` or what differs) and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORK = r'''
import hashlib, json, sys, pathlib
import numpy as np
import memfit
out = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(3)
src = {"x": rng.normal(size=(3000, 7)).astype("float32"), "y": rng.integers(0, 9, 3000)}
memfit.pack(src, out / "ds", shards=5, samples_per_record=8, split="train=0.8,val=0.2",
            progress=False, seed=4)
memfit.pack(src, out / "arr", format="arrays", progress=False, seed=4)
h = hashlib.sha256()
for p in sorted(out.rglob("*")):
    if p.is_file():
        h.update(p.relative_to(out).as_posix().encode()); h.update(p.read_bytes())
res = {"pack": h.hexdigest()}

def digest(ds):
    hh = hashlib.sha256()
    for b in ds.as_numpy_iterator() if hasattr(ds, "as_numpy_iterator") else ds:
        for k in (sorted(b) if isinstance(b, dict) else range(len(b))):
            hh.update(str(k).encode()); hh.update(np.asarray(b[k]).tobytes())
    return hh.hexdigest()

for name, path, kw in (("blocks", "ds", {"split": "train"}),
                       ("tf", "ds", {"split": "train", "reader": "tf"}),
                       ("arrays", "arr", {})):
    ds = memfit.dataset(str(out / path), 64, memory_budget="8MiB", epochs=2, **kw)
    res[f"stream {name}"] = digest(ds)
    res[f"plan {name}"] = str(ds.memfit_plan)

import keras
from memfit.estimate import Estimator

def mlp():
    return keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                             keras.layers.Dense(10)])

def cnn():
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3,
                             activation="relu"), keras.layers.MaxPooling2D(),
                             keras.layers.Flatten(), keras.layers.Dense(10)])

for name, make in (("mlp", mlp), ("cnn", cnn)):
    for policy in ("default", "fixed"):
        est = Estimator(make(), optimizer="adam", allocator=policy)
        e = est.at(64)
        res[f"estimate {name}/{policy}"] = [e.total, e.total_low, e.total_high, e.model_bytes,
                                            est.total(96), est.max_batch_size(2**30)]
print(json.dumps(res))
'''

SPEED = r'''
import sys, time
import memfit
ds = memfit.dataset(sys.argv[1], 256, memory_budget="256MiB", epochs=3)
it = iter(ds.as_numpy_iterator())
next(it)
n, t = 0, time.perf_counter()
for b in it:
    n += len(b["y"])
print(n / (time.perf_counter() - t))
'''


def child(src: Path, code: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(src.resolve()), "TF_CPP_MIN_LOG_LEVEL": "3",
           "MEMFIT_CACHE_DIR": str(cwd / "cache")}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the tree {src} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before", type=Path, help="the src/ directory of the tree before")
    p.add_argument("after", type=Path, help="the src/ directory of the tree after")
    p.add_argument("--rounds", type=int, default=0, help="throughput rounds (0: none)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfit-same-"))
    try:
        results = []
        for tree in (args.before, args.after):
            (work / "out").mkdir()
            results.append(json.loads(child(tree, WORK, str(work / "out"), cwd=work)))
            shutil.rmtree(work / "out")
        before, after = results
        differ = 0
        for key in before:
            same = before[key] == after.get(key)
            differ += not same
            said = "same" if same else f"DIFFERS: {before[key]!r} -> {after.get(key)!r}"
            print(f"{key:<24} {said}")
        if args.rounds:
            sys.path.insert(0, str(args.after.resolve()))
            import numpy as np

            import memfit

            rng = np.random.default_rng(0)
            memfit.pack({"x": rng.random((20000, 32, 32, 3), dtype=np.float32),
                         "y": rng.integers(0, 10, 20000)}, work / "speed", shards=16,
                        progress=False)
            ratios = []
            for _ in range(args.rounds):
                old = float(child(args.before, SPEED, str(work / "speed"), cwd=work))
                new = float(child(args.after, SPEED, str(work / "speed"), cwd=work))
                ratios.append(new / old)
            print(f"{'stream speed after/before':<24} median {statistics.median(ratios):.3f} "
                  f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
        return 1 if differ else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Fault campaign for `memfit pack`: SIGKILL it at random instants, rerun the same command,
and check that the dataset is byte-identical to a clean pack with no stray file.

Each kill: a fresh output directory; `python -m memfit pack ...` started as a subprocess;
SIGKILL after a delay drawn uniformly over a clean pack's duration (seeded); then the
same command again, to completion. The result must equal the clean pack file for file:
the same names, the same sha256 of every file (shards and manifest.json: the manifest
holds no timestamp, so it is compared whole), and nothing else — no `.tmp-*` file, no
pack state, nothing the manifest does not list.

With ``--overwrite``, each kill lands on `memfit pack --overwrite` replacing an existing,
different dataset (other data, half the size, half the shards, beside a file of the
user's). After the kill the path must hold a complete dataset that `memfit verify`
passes, and it must be the old one or the new one, file for file (the user's file
included); after the rerun, the new one, byte-identical to an uninterrupted pack, with no
stray file in it and nothing left beside it (no `.NAME.memfit-new`/`-old` sibling).

Usage:
    python benchmarks/faults_pack.py --kills 20 --seed 0 --size 400MiB --shards 64
    python benchmarks/faults_pack.py --overwrite --kills 20 --seed 0 --size 400MiB --shards 64

Prints a markdown table: kills, kills that landed while the pack ran, byte-identical
reruns, reruns that failed, stray files (with ``--overwrite``: also what the path held
after each kill: the old dataset, the new one, or neither, and `memfit verify` failures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from memfit.atomic import TMP_MARK, file_sha256
from memfit.sizes import format_size, parse_size

MANIFEST = "manifest.json"
USER_FILE = "notes.txt"         # beside the old dataset: it must survive its replacement


@dataclasses.dataclass
class Outcome:
    """What the campaign saw."""

    kills: int = 0
    landed: int = 0            # the pack was still running when SIGKILL came
    identical: int = 0         # reruns whose directory equals the clean pack's, byte for byte
    failed_reruns: int = 0     # reruns that exited non-zero
    stray_files: int = 0       # files left that the clean pack does not have
    clean_seconds: float = 0.0
    details: list[str] = dataclasses.field(default_factory=list)

    def table(self) -> str:
        rate = 100.0 * self.identical / max(self.kills, 1)
        return "\n".join([
            "| kills | landed mid-pack | byte-identical reruns | failed reruns | stray files |",
            "|---:|---:|---:|---:|---:|",
            f"| {self.kills} | {self.landed} | {self.identical} ({rate:.0f} %) | "
            f"{self.failed_reruns} | {self.stray_files} |"])


def make_inputs(directory: Path, size: int, seed: int = 0) -> dict[str, Path]:
    """``x.npy`` (float32 rows of 1 KiB) and ``y.npy`` (int64 labels), about ``size`` bytes."""
    rng = np.random.default_rng(seed)
    rows = max(64, size // (256 * 4 + 8))
    paths = {"x": directory / "x.npy", "y": directory / "y.npy"}
    x = np.lib.format.open_memmap(paths["x"], mode="w+", dtype=np.float32, shape=(rows, 256))
    for a in range(0, rows, 65536):
        b = min(rows, a + 65536)
        x[a:b] = rng.random((b - a, 256), dtype=np.float32)
    x.flush()
    del x
    np.save(paths["y"], rng.integers(0, 1000, rows).astype(np.int64))
    return paths


def pack_command(inputs: dict[str, Path], out: Path, shards: int, workers: int,
                 overwrite: bool = False) -> list[str]:
    return [sys.executable, "-m", "memfit", "pack", *(f"{k}={v}" for k, v in inputs.items()),
            "-o", str(out), "--shards", str(shards), "--workers", str(workers), "--quiet",
            *(["--overwrite"] if overwrite else [])]


def listing(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (relative path → sha256)."""
    return {str(p.relative_to(directory)): file_sha256(p)
            for p in sorted(directory.rglob("*")) if p.is_file() or p.is_symlink()}


def strays(directory: Path) -> list[str]:
    """Files that are temporary (``.tmp-*``) or that the manifest does not list."""
    listed = {MANIFEST}
    manifest = directory / MANIFEST
    if manifest.is_file():
        doc = json.loads(manifest.read_text())
        for split in doc.get("splits", {}).values():
            listed |= {s["file"] for s in split.get("shards", [])}
            listed |= {f["file"] for f in split.get("files", {}).values()}
    return [str(p.relative_to(directory)) for p in sorted(directory.rglob("*"))
            if not p.is_dir() and (p.name.startswith(TMP_MARK)
                                   or str(p.relative_to(directory)) not in listed)]


def startup_seconds() -> float:
    """How long `python -m memfit` takes to start (a kill before it writes nothing)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memfit", "--version"], check=True,
                   capture_output=True)
    return time.perf_counter() - started


def campaign(workdir: Path, *, kills: int, seed: int, size: int, shards: int,
             workers: int = 1, earliest: float = 0.0, log=print) -> Outcome:
    """Runs the campaign in ``workdir`` (inputs, the clean pack, one directory per kill);
    each delay is drawn uniformly from ``earliest`` to the clean pack's duration."""
    inputs = make_inputs(workdir, size, seed)
    reference = workdir / "clean"
    durations = []
    for attempt in range(2):    # the faster of two (the machine is shared); and they agree
        shutil.rmtree(reference, ignore_errors=True)
        started = time.perf_counter()
        subprocess.run(pack_command(inputs, reference, shards, workers), check=True,
                       capture_output=True)
        durations.append(time.perf_counter() - started)
        if attempt == 0:
            first = listing(reference)
    outcome = Outcome(clean_seconds=min(durations))
    expected = listing(reference)
    if expected != first:
        raise SystemExit("two clean packs of the same input differ: pack is not deterministic")
    log(f"clean pack: {len(expected)} files, "
        f"{format_size(sum(p.stat().st_size for p in reference.iterdir()))} in "
        f"{outcome.clean_seconds:.2f} s")
    rng = random.Random(seed)
    out = workdir / "killed"
    for i in range(kills):
        shutil.rmtree(out, ignore_errors=True)
        delay = rng.uniform(min(earliest, outcome.clean_seconds), outcome.clean_seconds)
        command = pack_command(inputs, out, shards, workers)
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        landed = proc.poll() is None
        proc.kill()
        proc.wait()
        rerun = subprocess.run(command, capture_output=True, text=True)
        outcome.kills += 1
        outcome.landed += landed
        got = listing(out) if out.is_dir() else {}
        stray = strays(out) if out.is_dir() else []
        outcome.stray_files += len(stray)
        ok = rerun.returncode == 0 and got == expected and not stray
        outcome.identical += ok
        outcome.failed_reruns += rerun.returncode != 0
        if not ok:
            diff = sorted(set(got.items()) ^ set(expected.items()))[:4]
            outcome.details.append(f"kill {i} at {delay:.2f} s: rerun rc={rerun.returncode} "
                                   f"{rerun.stderr.strip()[-300:]!r}; stray {stray}; "
                                   f"differing {diff}")
        log(f"kill {i + 1}/{kills} at {delay:.2f} s ({'mid-pack' if landed else 'after'}): "
            f"{'identical' if ok else 'DIFFERENT'}")
    return outcome


@dataclasses.dataclass
class OverwriteOutcome:
    """What the overwrite campaign saw."""

    kills: int = 0
    landed: int = 0            # the pack was still running when SIGKILL came
    held_old: int = 0          # after the kill: the old dataset, file for file
    held_new: int = 0          # after the kill: the new one, file for file
    held_neither: int = 0      # after the kill: anything else (a dataset lost)
    verify_failed: int = 0     # `memfit verify` of the path after the kill failed
    identical: int = 0         # reruns that gave the clean pack's bytes, nothing beside
    failed_reruns: int = 0
    stray_files: int = 0       # in the dataset, or beside it, after the rerun
    clean_seconds: float = 0.0
    details: list[str] = dataclasses.field(default_factory=list)

    def table(self) -> str:
        rate = 100.0 * self.identical / max(self.kills, 1)
        return "\n".join([
            "| kills | landed mid-pack | after the kill: old / new / neither | verify failed "
            "| byte-identical reruns | failed reruns | stray files |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {self.kills} | {self.landed} | {self.held_old} / {self.held_new} / "
            f"{self.held_neither} | {self.verify_failed} | {self.identical} ({rate:.0f} %) | "
            f"{self.failed_reruns} | {self.stray_files} |"])

    @property
    def ok(self) -> bool:
        return (self.identical == self.kills and self.held_neither == 0
                and self.verify_failed == 0 and self.stray_files == 0)


def _place_old(reference: Path, out: Path) -> None:
    """A fresh copy of the old dataset at ``out`` (hard links: a pack never writes into a
    file in place, it renames new ones over), in a parent of its own."""
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir(parents=True)
    shutil.copytree(reference, out, copy_function=os.link)


def campaign_overwrite(workdir: Path, *, kills: int, seed: int, size: int, shards: int,
                       workers: int = 1, earliest: float = 0.0, log=print) -> OverwriteOutcome:
    """The campaign of ``--overwrite`` (module docstring), in ``workdir``; each delay is
    drawn uniformly from ``earliest`` to an uninterrupted replacement's duration."""
    for d in ("new-input", "old-input"):
        (workdir / d).mkdir(exist_ok=True)
    inputs = make_inputs(workdir / "new-input", size, seed)
    old_inputs = make_inputs(workdir / "old-input", size // 2, seed + 1)
    old_ref, new_ref = workdir / "old", workdir / "clean"
    subprocess.run(pack_command(old_inputs, old_ref, max(1, shards // 2), workers),
                   check=True, capture_output=True)
    (old_ref / USER_FILE).write_text("the user's own file, kept across the replacement\n")
    subprocess.run(pack_command(inputs, new_ref, shards, workers), check=True,
                   capture_output=True)
    old = listing(old_ref)
    expected = {**listing(new_ref), USER_FILE: old[USER_FILE]}
    command = lambda out: pack_command(inputs, out, shards, workers, overwrite=True)  # noqa: E731
    durations = []
    timing = workdir / "timing" / "out"
    for _ in range(2):          # the faster of two (the machine is shared); and they agree
        _place_old(old_ref, timing)
        started = time.perf_counter()
        subprocess.run(command(timing), check=True, capture_output=True)
        durations.append(time.perf_counter() - started)
        if listing(timing) != expected or os.listdir(timing.parent) != ["out"]:
            raise SystemExit("an uninterrupted --overwrite pack differs from a fresh pack")
    outcome = OverwriteOutcome(clean_seconds=min(durations))
    log(f"old dataset: {len(old)} files; new: {len(expected)} files; uninterrupted "
        f"--overwrite pack {outcome.clean_seconds:.2f} s")
    rng = random.Random(seed)
    out = workdir / "killed" / "out"
    for i in range(kills):
        _place_old(old_ref, out)
        delay = rng.uniform(min(earliest, outcome.clean_seconds), outcome.clean_seconds)
        proc = subprocess.Popen(command(out), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        landed = proc.poll() is None
        proc.kill()
        proc.wait()
        outcome.kills += 1
        outcome.landed += landed
        held = listing(out) if out.is_dir() else {}
        which = "old" if held == old else "new" if held == expected else "neither"
        outcome.held_old += which == "old"
        outcome.held_new += which == "new"
        outcome.held_neither += which == "neither"
        check = subprocess.run([sys.executable, "-m", "memfit", "verify", str(out), "--quiet"],
                               capture_output=True, text=True)
        outcome.verify_failed += check.returncode != 0
        rerun = subprocess.run(command(out), capture_output=True, text=True)
        got = listing(out) if out.is_dir() else {}
        stray = [f for f in (strays(out) if out.is_dir() else []) if f != USER_FILE] + \
            [f"../{n}" for n in sorted(os.listdir(out.parent)) if n != "out"]
        outcome.stray_files += len(stray)
        ok = rerun.returncode == 0 and got == expected and not stray
        outcome.identical += ok
        outcome.failed_reruns += rerun.returncode != 0
        if not ok or which == "neither" or check.returncode != 0:
            diff = sorted(set(got.items()) ^ set(expected.items()))[:4]
            outcome.details.append(
                f"kill {i} at {delay:.2f} s: held {which}, verify rc={check.returncode} "
                f"{check.stdout.strip()[-200:]!r}; rerun rc={rerun.returncode} "
                f"{rerun.stderr.strip()[-300:]!r}; stray {stray}; differing {diff}")
        log(f"kill {i + 1}/{kills} at {delay:.2f} s ({'mid-pack' if landed else 'after'}): "
            f"held {which}, verify {'ok' if check.returncode == 0 else 'FAILED'}, rerun "
            f"{'identical' if ok else 'DIFFERENT'}")
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs (20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and delays (0)")
    parser.add_argument("--size", default="400MiB", help="input size (400MiB)")
    parser.add_argument("--shards", type=int, default=64, help="shards (64)")
    parser.add_argument("--workers", type=int, default=1, help="pack --workers (1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="kill `memfit pack --overwrite` replacing a different dataset")
    parser.add_argument("--after-startup", action="store_true",
                        help="draw delays from the end of `python -m memfit`'s start-up")
    parser.add_argument("--workdir", help="where to work (default: a temporary directory)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="memfit-faults-pack-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = campaign_overwrite if args.overwrite else campaign
    try:
        outcome = run(workdir, kills=args.kills, seed=args.seed,
                      size=parse_size(args.size, name="size"), shards=args.shards,
                      workers=args.workers, log=lambda m: print(m, file=sys.stderr),
                      earliest=startup_seconds() if args.after_startup else 0.0)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    command = " ".join(["python benchmarks/faults_pack.py", *sys.argv[1:]])
    what = "uninterrupted --overwrite pack" if args.overwrite else "clean pack"
    print(f"`{command}` ({what} {outcome.clean_seconds:.2f} s, seed {args.seed})\n")
    print(outcome.table())
    for d in outcome.details:
        print(f"- {d}")
    if isinstance(outcome, OverwriteOutcome):
        return 0 if outcome.ok else 1
    ok = outcome.identical == outcome.kills and outcome.stray_files == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

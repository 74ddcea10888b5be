"""`memfit pack --tfrecord` SIGKILLed at random instants (seeded), then rerun: the rerun
gives the clean pack's bytes, file for file, and leaves no stray file (no `.tmp-*` file,
no scratch index, nothing the manifest does not list). The TFRecord files are the
recipe's, written by benchmarks/pack_sources.py; the checks are benchmarks/faults_pack.py's."""

import contextlib
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import faults_pack  # noqa: E402
import pack_sources  # noqa: E402

KILLS = 4


def _pack(args, out):
    return [sys.executable, "-m", "memfit", "pack", *args, "-o", str(out), "--shards", "24",
            "--quiet"]


def test_sigkill_tfrecord_pack_at_random_instants_then_rerun_is_byte_identical(tmp_path):
    source = tmp_path / "recipe"
    source.mkdir()
    args = pack_sources.make_child("tfrecord", source, 128 * 2**20)
    reference = tmp_path / "clean"
    durations, listings = [], []
    for _ in range(2):          # the faster of two (the machine is shared); and they agree
        shutil.rmtree(reference, ignore_errors=True)
        started = time.perf_counter()
        subprocess.run(_pack(args, reference), check=True, capture_output=True,
                       env=pack_sources.ENV)
        durations.append(time.perf_counter() - started)
        listings.append(faults_pack.listing(reference))
    expected = listings[0]
    assert listings[1] == expected, "two clean packs of the same TFRecord files differ"
    assert len(expected) == 24 + 1 and faults_pack.strays(reference) == []   # shards + manifest
    clean = min(durations)
    earliest = min(faults_pack.startup_seconds(), clean)
    rng = random.Random(30)
    out = tmp_path / "killed"
    killed, details, i = 0, [], 0
    # A kill after the pack ended proves nothing: it is drawn again, within what that pack
    # took (the clean packs may have run while the machine was busier than now).
    while killed < KILLS and i < 3 * KILLS:
        i += 1
        shutil.rmtree(out, ignore_errors=True)
        delay = rng.uniform(earliest, clean)
        proc = subprocess.Popen(_pack(args, out), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=pack_sources.ENV)
        started = time.perf_counter()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=delay)
        landed = proc.poll() is None
        if not landed:
            clean = time.perf_counter() - started
            earliest = min(earliest, clean / 2)
        killed += landed
        proc.kill()
        proc.wait()
        partial = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        rerun = subprocess.run(_pack(args, out), capture_output=True, text=True,
                               env=pack_sources.ENV)
        print(f"kill {i} ({killed} of {KILLS} landed) at {delay:.2f} s (startup "
              f"{earliest:.2f} s, clean pack {clean:.2f} s): "
              f"{'mid-pack' if landed else 'after the pack'}, "
              f"{len(partial)} files left")
        got = faults_pack.listing(out) if out.is_dir() else {}
        stray = faults_pack.strays(out) if out.is_dir() else []
        if rerun.returncode or got != expected or stray:
            details.append(f"kill {i} at {delay:.2f} s: rc={rerun.returncode} "
                           f"{rerun.stderr[-300:]!r}; stray {stray}; differing "
                           f"{sorted(set(got.items()) ^ set(expected.items()))[:4]}")
    assert details == []
    assert killed == KILLS, f"{killed} kills of {i} landed while the pack ran (clean pack " \
                            f"{clean:.2f} s)"

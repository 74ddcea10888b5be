"""Bad input, given on purpose to every subcommand, as a stranger would.

Each case runs `python -m memfit ...` in a fresh process (what the user runs) in an empty
directory holding a few small files, and checks what the user reads: an exit code of 2
(127 for a command that does not exist, as a shell says), one clear error line that
quotes the value, no Python traceback, and nothing new left on disk. (TensorFlow's
start-up lines are issue 15's: not checked here.) docs/reliability.md counts these cases.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import memfit
import memfit.errors

ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stranger")
    # A first estimate measures and caches the framework baseline: never in the user's
    # cache, and not in the place whose files are counted.
    ENV["MEMFIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    np.save(root / "x.npy", np.zeros((10, 3), np.float32))
    np.save(root / "y.npy", np.zeros((7,), np.int64))
    np.save(root / "y10.npy", np.zeros((10,), np.int64))
    (root / "afile").write_text("not a directory")
    (root / "garbage.npy").write_bytes(b"not an array at all")
    (root / "npys").mkdir()
    np.save(root / "npys" / "x.npy", np.zeros((10, 3), np.float32))
    (root / "npys" / "y.npy").write_bytes(b"\x93NUMPY garbage after the magic")
    (root / "photos").mkdir()
    (root / "photos" / "a.txt").write_text("a folder, not an array")
    np.savez(root / "all.npz", x=np.zeros((10, 2)), y=np.arange(10))
    (root / "bad.csv").write_text("a,b,label\n1,2,0\n3,oops,1\n")
    for name, manifest in {"list": [], "number": 3, "broken": "{not json"}.items():
        (root / f"m-{name}").mkdir()
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (root / f"m-{name}" / "manifest.json").write_text(text)
    (root / "bad.toml").write_text("[[job]\nname = 'a'\n")
    (root / "nojobs.toml").write_text("title = 'no jobs here'\n")
    (root / "garbage.jsonl").write_text("this is not a memfit log\n")
    (root / "train.py").write_text("print('hello')\n")
    (root / "mod.py").write_text(textwrap.dedent("""
        def not_a_model():
            return 42
        """))
    return root


CASES = [
    # pack
    (["pack", "-o", "out"], 2, "NAME=FILE.npy"),
    (["pack", "x=missing.npy", "-o", "out"], 2, "missing.npy"),
    (["pack", "x=x.npy", "y=y.npy", "-o", "out"], 2, "10"),
    (["pack", "x=x.npy", "-o", "afile/sub"], 2, "afile"),
    (["pack", "x=photos", "-o", "out"], 2, "'photos' is a folder (of images?"),
    (["pack", "x=all.npz", "-o", "out"], 2, "give the .npz on its own"),
    (["pack", "table.parquet", "-o", "out"], 2, "--parquet PATH --label COLUMN"),
    (["pack", "mine.tfrecords", "-o", "out"], 2, "--tfrecord PATH"),
    (["inspect", "all.npz"], 2, "'all.npz' is not a TFRecord file"),
    (["pack", "x=x.npy", "--crop-to-aspect-ratio", "-o", "out"], 2,
     "--crop-to-aspect-ratio applies to images only"),
    (["pack", "x=x.npy", "--on-corrupt", "skip", "-o", "out"], 2,
     "--on-corrupt applies to images only"),
    (["pack", "--csv", "photos", "--label", "a", "-o", "out"], 2,
     "'photos' is a directory, not a CSV file"),
    # a pipe (--csv <(zcat t.csv.gz)) exists: it was called missing
    (["pack", "--csv", "/dev/null", "--label", "a", "-o", "out"], 2,
     "'/dev/null' is not a regular file (a pipe or a device"),
    (["pack", "--images", "photos", "--image-size", "8,8", "--variable", "image", "-o", "out"],
     2, "--variable applies to arrays, iterables and TFRecord files"),
    (["pack", "--images", "photos", "--image-size", "8,8", "--keep-encoded", "--format",
      "arrays", "-o", "out"], 2, "images kept encoded vary in size"),
    (["pack", "--csv", "bad.csv", "--label", "label", "-o", "out"], 2, "oops"),
    (["pack", "x=x.npy", "y=y10.npy", "--split", "train=1.0,val=0.0", "-o", "out"], 2, "val"),
    (["pack", "x=x.npy", "--split", "nonsense", "-o", "out"], 2, "nonsense"),
    (["pack", "x=x.npy", "--split", "train=0.5,train=0.5", "-o", "out"], 2,
     "split names 'train' twice"),
    (["pack", "x=x.npy", "--split", "train=1.0,val=0", "-o", "out"], 2,
     "val=0 is not (leave out a split that gets nothing)"),
    (["pack", "x=x.npy", "--shards", "0", "-o", "out"], 2, "0"),
    # a value that begins with '-' reads as an option to argparse: say so, and the = form
    (["pack", "--images", "photos", "--image-size", "-3,32", "-o", "out"], 2,
     "'-3,32' begins with '-', so it reads as an option: give it as --image-size=-3,32"),
    (["pack", "--images", "photos", "--image-size=-3,32", "-o", "out"], 2,
     "must be two positive integers"),
    # inspect / verify
    (["inspect", "nowhere"], 2, "nowhere"),
    (["inspect", "m-list"], 2, "manifest.json"),
    (["inspect", "garbage.npy"], 2, "'garbage.npy' is not a readable .npy file"),
    (["inspect", "npys"], 2, "'npys/y.npy' is not a readable .npy file"),
    (["verify", "m-number"], 2, "manifest.json"),
    (["verify", "m-broken"], 2, "manifest.json"),
    # run / watch
    (["run", "--max-rss", "0", "--", "true"], 2, "Received: --max-rss 0"),
    (["run", "--max-rss", "lots", "--", "true"], 2, "lots"),
    # a stranger's --max-rss 10 started the training and stopped it with exit 78
    (["run", "--max-rss", "10", "--", "true"], 2,
     "A memory size without a unit is a number of bytes: 10 is 10 B, too little for "
     "anything to run in. Give a unit, such as 10GiB or 10MiB"),
    (["run", "--restart-every", "0", "--", "true"], 2, "Received: --restart-every 0"),
    (["run", "--", "no-such-program-here"], 127, "no-such-program-here"),
    (["watch", "--", "no-such-program-here"], 127, "no-such-program-here"),
    (["watch", "--interval", "0", "--", "true"], 2, "interval"),
    # a script that is not there: Python would exit 2 at once, and run would restart it
    (["run", "--", sys.executable, "-u", "trian.py"], 2, "the script 'trian.py' does not exist"),
    (["watch", "--", sys.executable, "trian.py"], 2, "the script 'trian.py' does not exist"),
    (["doctor", "--", sys.executable, "photos.py"], 2, "the script 'photos.py' does not"),
    # report
    (["report", "nowhere"], 2, "nowhere"),
    (["report", "garbage.jsonl"], 2, "garbage.jsonl"),
    # estimate / find-batch-size / calibrate
    (["estimate", "nosuchmodule:make"], 2, "nosuchmodule"),
    (["estimate", "mod:not_a_model", "-b", "4"], 2, "not_a_model"),
    (["estimate", "keras.applications:MobileNetV2", "-b", "0"], 2, "0"),
    (["estimate", "keras.applications:MobileNetV2", "--budget", "lots"], 2, "lots"),
    (["find-batch-size", "mod:not_a_model", "--budget", "1GiB", "--start", "0"], 2, "start"),
    (["find-batch-size", "mod:not_a_model", "--budget", "huge"], 2, "huge"),
    (["find-batch-size", "mod:not_a_model", "--budget", "10"], 2,   # was a child, then exit 1
     "10 is 10 B, too little for anything to run in. Give a unit, such as 10GiB"),
    (["find-batch-size", "mod:not_a_model", "--budget", "0"], 2,
     "budget must be more than 0 bytes"),
    (["estimate", "keras.applications:MobileNetV2", "--budget", "0MiB"], 2,
     "budget must be more than 0 bytes"),
    (["find-batch-size", "mod:not_a_model", "--budget", "1GiB", "--steps", "0"], 2,
     "Received: --steps 0"),
    (["find-batch-size", "mod:not_a_model", "--budget", "1GiB", "--precision", "-1"], 2,
     "Received: --precision -1.0"),
    (["calibrate", "--runs", "0"], 2, "runs"),
    # share
    (["share", "missing.toml"], 2, "missing.toml"),
    (["share", "bad.toml"], 2, "bad.toml"),
    (["share", "nojobs.toml"], 2, "job"),
    # doctor
    (["doctor", "--steps", "0", "--", sys.executable, "train.py"], 2, "0"),
    (["doctor", "--", "no-such-program-here"], 127, "no-such-program-here"),
]


@pytest.mark.parametrize("argv, code, quoted", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_clear_error_and_leaves_nothing(place, argv, code, quoted):
    before = _files(place)
    proc = subprocess.run([sys.executable, "-m", "memfit", *argv], cwd=place, env=ENV,
                          capture_output=True, text=True, timeout=120)
    said = proc.stdout + proc.stderr
    new = _files(place) - before
    for path in sorted(new, reverse=True):          # leave the place as it was
        target = place / path
        target.unlink() if target.is_file() else target.rmdir()
    assert proc.returncode == code, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert quoted in proc.stderr, said[-3000:]
    assert "error" in proc.stderr.lower()
    assert not new, f"left behind: {sorted(new)}"


@pytest.mark.parametrize(("call", "error", "said"), [
    (lambda: memfit.dataset(5, 32), memfit.errors.DatasetError,
     "memfit.dataset's path must be a packed directory, .npy arrays or TFRecord files (a "
     "path, a dict of paths, or a list of files). Received: path=5 of type int"),
    (lambda: memfit.format_size("x"), TypeError,
     "format_size formats a number of bytes (an int or a float); to read a size such as "
     "'2GiB', use parse_size. Received: 'x'"),
    (lambda: memfit.MemoryMonitor("never-made", verbose=5), ValueError,
     "verbose must be 1 (say the verdict when it changes and at the end of training) or 0 "
     "(silent). Received: verbose=5"),
], ids=["dataset", "format_size", "monitor"])
def test_a_wrong_argument_is_one_line_naming_it(tmp_path, monkeypatch, call, error, said):
    """A stranger's wrong arguments met Python's own errors ("expected str, bytes or
    os.PathLike object, not int"), or were taken silently."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as e:
        call()
    assert str(e.value) == said
    assert not (tmp_path / "never-made").exists()                  # nothing made first
    assert memfit.format_size(np.int64(2048)) == "2.0 KiB"          # numpy numbers are numbers


def test_a_backend_or_an_option_the_estimate_cannot_serve_is_one_line(tmp_path):
    """A stranger's KERAS_BACKEND=torch (not installed) got a 59-line traceback from inside
    Keras; on JAX, --allocator fixed was ignored in silence, and --device gpu:0 on a CPU
    machine printed the CPU's figures under gpu:0 (find-batch-size a CPU batch size)."""
    model = tmp_path / "m.py"
    model.write_text("import keras\n\ndef mlp():\n    return keras.Sequential([keras.Input((4,)), "
                     "keras.layers.Dense(2)])\n")
    cases = [("torch", ["estimate", f"{model}:mlp", "-b", "8"],
              "memfit estimate: error: memfit estimates training memory on Keras's TensorFlow "
              "or JAX backend, and Keras is set to run on torch here: set "
              "KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax. Received: KERAS_BACKEND=torch"),
             ("torch", ["calibrate"], "memfit calibrate: error: memfit calibrate runs on "
                                      "Keras's TensorFlow or JAX backend"),
             ("jax", ["estimate", f"{model}:mlp", "-b", "8", "--allocator", "fixed"],
              "memfit estimate: error: --allocator fixed applies to the estimate on "
              "TensorFlow"),
             ("jax", ["estimate", f"{model}:mlp", "-b", "8", "--device", "gpu:0"],
              "memfit estimate: error: --device gpu:0, but JAX runs on the cpu here (it sees "
              "no GPU)")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MEMFIT_CACHE_DIR": str(tmp_path / "cache")}
    for backend, argv, said in cases:
        p = subprocess.run([sys.executable, "-m", "memfit", *argv], capture_output=True,
                           text=True, timeout=300, env={**env, "KERAS_BACKEND": backend})
        assert p.returncode == 2, (argv, p.stderr[-2000:])
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith(said), (argv, p.stderr[-2000:])
        assert "Traceback" not in p.stderr, p.stderr[-2000:]

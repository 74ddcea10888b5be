"""How accurate is ``memfit.estimate``? Predicted vs measured training memory on a panel.

Each case (model × batch size × dtype policy) is measured in its own child process
(``memfit.estimate.measure.measure_training``: a few real ``train_on_batch`` steps) and
predicted by the estimator in this process. "Measured" is the peak anonymous RSS of the
training process from model load to the end of the steps, minus its anonymous RSS after
``import tensorflow, keras`` (the framework baseline, reported apart by the estimate).

    .venv/bin/python benchmarks/estimate_accuracy.py                 # measure + predict
    .venv/bin/python benchmarks/estimate_accuracy.py --save m.json   # keep measurements
    .venv/bin/python benchmarks/estimate_accuracy.py --reuse m.json  # re-predict only
    .venv/bin/python benchmarks/estimate_accuracy.py --reuse m.json --fit   # refit

The children run under an allocator policy (``--allocator``, see
:mod:`memfit.memory.allocator`): ``fixed`` (glibc's mmap threshold fixed at 128 KiB; this
benchmark's default, because its measurements repeat to 0.3 %) or ``default`` (glibc as it
comes, the estimate's default: a plain training process), and the estimate predicts for
the same policy. Prints a markdown table, the mean
relative error and the share of under-estimates; ``--fit`` also refits the estimator's
fitted constants for that policy (least squares on relative error) and prints their
leave-one-model-out mean relative error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import keras

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import estimate_fit as fitting  # noqa: E402

SOURCE = str(HERE)

# -- the panel: factories the child imports as benchmarks/estimate_accuracy.py:NAME ----------


def mlp() -> keras.Model:
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                             keras.layers.Dense(1024, activation="relu"),
                             keras.layers.Dense(10)], name="mlp")


def mlp_bn_dropout() -> keras.Model:
    x = inputs = keras.Input((512,))
    for _ in range(3):
        x = keras.layers.Dense(1024)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("relu")(x)
        x = keras.layers.Dropout(0.3)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x), name="mlp_bn_dropout")


def small_cnn() -> keras.Model:
    return keras.Sequential([
        keras.Input((64, 64, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ], name="small_cnn")


def resnet50() -> keras.Model:
    return keras.applications.ResNet50(weights=None, input_shape=(96, 96, 3), classes=10)


def mobilenet_v2() -> keras.Model:
    return keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=10)


def efficientnet_b0() -> keras.Model:
    return keras.applications.EfficientNetB0(weights=None, input_shape=(96, 96, 3),
                                             classes=10)


def lstm() -> keras.Model:
    return keras.Sequential([keras.Input((50, 32)), keras.layers.LSTM(128),
                             keras.layers.Dense(10)], name="lstm")


def transformer_block() -> keras.Model:
    tokens = keras.Input((64,), dtype="int32")
    x = keras.layers.Embedding(5000, 128)(tokens)
    attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=32)(x, x)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dropout(0.1)(attention))
    ff = keras.layers.Dense(512, activation="gelu")(x)
    ff = keras.layers.Dense(128)(ff)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dropout(0.1)(ff))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2)(x), name="transformer_block")


def embedding_bag() -> keras.Model:
    return keras.Sequential([keras.Input((100,), dtype="int32"),
                             keras.layers.Embedding(20000, 64),
                             keras.layers.GlobalAveragePooling1D(),
                             keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(1)], name="embedding_bag")


class Subclassed(keras.Model):
    """A subclassed model: conv stem, pooled, two dense layers (needs an input shape)."""

    def __init__(self) -> None:
        super().__init__(name="subclassed")
        self.conv1 = keras.layers.Conv2D(32, 3, activation="relu")
        self.conv2 = keras.layers.Conv2D(64, 3, strides=2, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.dense = keras.layers.Dense(256, activation="relu")
        self.out = keras.layers.Dense(10)

    def call(self, x: object) -> object:
        return self.out(self.dense(self.pool(self.conv2(self.conv1(x)))))


def subclassed() -> keras.Model:
    return Subclassed()


# name, batch sizes, input shape (only the subclassed model needs one)
PANEL: list[tuple[str, tuple[int, ...], tuple[int, ...] | None]] = [
    ("mlp", (32, 256, 2048), None),
    ("mlp_bn_dropout", (32, 256, 1024), None),
    ("small_cnn", (16, 64, 256), None),
    ("resnet50", (8, 32, 64), None),
    ("mobilenet_v2", (16, 64, 128), None),
    ("efficientnet_b0", (8, 32, 64), None),
    ("lstm", (32, 128, 512), None),
    ("transformer_block", (16, 64, 256), None),
    ("embedding_bag", (32, 256, 2048), None),
    ("subclassed", (16, 64, 256), (64, 64, 3)),
]
POLICIES = ("float32", "mixed_float16")


def measure_all(cases: list, saved: dict, save: Path | None, *, steps: int,
                allocator: str) -> dict:
    from memfit.estimate.measure import measure_training

    for name, batch, policy, shape in cases:
        key = f"{name}|{batch}|{policy}"
        if key in saved:
            continue
        t = time.time()
        r = measure_training(f"{SOURCE}:{name}", batch, dtype_policy=policy,
                             input_shape=shape, steps=steps, allocator=allocator)
        saved[key] = {"status": r.status, "measured": r.measured, "report": r.report,
                      "message": r.message, "steps": steps, "allocator": allocator}
        print(f"measured {key}: {r.status} {r.measured} ({time.time() - t:.0f} s)",
              file=sys.stderr, flush=True)
        if save is not None:
            save.write_text(json.dumps(saved, indent=1))
    return saved


def predict_all(cases: list, allocator: str) -> tuple[dict, dict]:
    """Predicted ``model_bytes`` per case, and the estimator's raw features (for --fit)."""
    from memfit.estimate import Estimator

    out: dict = {}
    features: dict = {}
    groups: dict = {}
    for name, batch, policy, shape in cases:
        groups.setdefault((name, policy, shape), []).append(batch)
    for (name, policy, shape), batches in groups.items():
        keras.backend.clear_session()
        est = Estimator(f"{SOURCE}:{name}", dtype_policy=policy, input_shape=shape,
                        allocator=allocator)
        for batch in batches:
            out[f"{name}|{batch}|{policy}"] = est.at(batch).model_bytes
            features[f"{name}|{batch}|{policy}"] = est.features(batch)
    return out, features


def table(cases: list, measured: dict, predicted: dict) -> tuple[str, float, float]:
    rows = ["| model | policy | batch | predicted MiB | measured MiB | error |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    errors = []
    for name, batch, policy, _ in cases:
        key = f"{name}|{batch}|{policy}"
        m = measured.get(key, {})
        p = predicted.get(key)
        if m.get("status") != "ok" or p is None:
            rows.append(f"| {name} | {policy} | {batch} | - | - | {m.get('status')} |")
            continue
        err = (p - m["measured"]) / m["measured"]
        errors.append(err)
        rows.append(f"| {name} | {policy} | {batch} | {p / 2**20:,.1f} | "
                    f"{m['measured'] / 2**20:,.1f} | {err * 100:+.1f} % |")
    mre = sum(abs(e) for e in errors) / max(len(errors), 1)
    under = sum(e < 0 for e in errors) / max(len(errors), 1)
    return "\n".join(rows), mre, under


def fit(cases: list, measured: dict, features: dict) -> str:
    """Refits the constants with the smallest margin that keeps under-estimates at 5 %
    (see :func:`estimate_fit.fit`); reports the in-sample and leave-one-model-out errors."""
    rows = {}
    for name, batch, policy, _ in cases:
        key = f"{name}|{batch}|{policy}"
        if measured.get(key, {}).get("status") == "ok" and key in features:
            rows.setdefault(name, []).append((features[key], measured[key]["measured"]))
    every = [r for rs in rows.values() for r in rs]

    constants = fitting.fit(every, under=0.05)
    bare = {**constants, "margin": 0.0}
    errs, errs_bare = fitting.errors(every, constants), fitting.errors(every, bare)
    lomo, lomo_bare = [], []
    for name in rows:
        c = fitting.fit([r for n, rs in rows.items() if n != name for r in rs], under=0.05)
        lomo += fitting.errors(rows[name], c)
        lomo_bare += fitting.errors(rows[name], {**c, "margin": 0.0})
    mean, under = fitting.mean_abs, fitting.under_share
    return (f"fitted: {json.dumps({k: round(v, 6) for k, v in constants.items()})}\n"
            f"in-sample: mean relative error {mean(errs) * 100:.1f} %, under-estimates "
            f"{under(errs) * 100:.0f} % (without the margin: {mean(errs_bare) * 100:.1f} %,"
            f" {under(errs_bare) * 100:.0f} %)\n"
            f"leave-one-model-out: mean relative error {mean(lomo) * 100:.1f} %, "
            f"under-estimates {under(lomo) * 100:.0f} % (without the margin: "
            f"{mean(lomo_bare) * 100:.1f} %, {under(lomo_bare) * 100:.0f} %)")


def main() -> None:
    from memfit.estimate.measure import DEFAULT_STEPS
    from memfit.memory.allocator import ALLOCATOR_POLICIES

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save", type=Path, help="write measurements here as they come")
    parser.add_argument("--reuse", type=Path, help="measurements from an earlier --save")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help="training steps per measuring child")
    parser.add_argument("--allocator", choices=ALLOCATOR_POLICIES, default="fixed",
                        help="allocator policy of the children, and of the estimate")
    parser.add_argument("--measure-only", action="store_true")
    parser.add_argument("--fit", action="store_true",
                        help="refit the estimator's constants on these measurements")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    only = set(args.only.split(",")) if args.only else None
    cases = [(name, b, policy, shape) for name, batches, shape in PANEL
             if only is None or name in only
             for policy in args.policies.split(",") for b in batches]
    saved: dict = {}
    for path in (args.reuse, args.save):
        if path is not None and path.exists():
            saved.update(json.loads(path.read_text()))
    other = {v.get("allocator", "default") for v in saved.values()} - {args.allocator}
    if other:
        sys.exit(f"the saved measurements were made under allocator policy "
                 f"{', '.join(sorted(other))}, not --allocator {args.allocator}")
    measured = measure_all(cases, saved, args.save, steps=args.steps,
                           allocator=args.allocator)
    if args.measure_only:
        return
    predicted, features = predict_all(cases, args.allocator)
    text, mre, under = table(cases, measured, predicted)
    print(text)
    print(f"\n{len(cases)} cases (allocator policy {args.allocator}): mean relative error "
          f"{mre * 100:.1f} %, under-estimates {under * 100:.0f} %")
    if args.fit:
        print(fit(cases, measured, features))


if __name__ == "__main__":
    main()

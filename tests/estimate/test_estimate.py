"""The estimator's numbers against hand computation, on a 46-parameter model.

tiny: Input 8 -> Dense(4, relu) -> Dense(2). Parameters: 8*4 + 4 = 36 and 4*2 + 2 = 10,
46 in all: 184 bytes of float32 weights.
"""

from pathlib import Path

import pytest

import memfit
from memfit.estimate import EstimateError, Estimator, slots_per_weight
from memfit.estimate.optimizers import OPTIMIZERS, make_optimizer

MODELS = Path(__file__).with_name("models.py")
TINY = f"{MODELS}:tiny"
WEIGHTS = 46 * 4
SCALARS = 8 + 4          # every Keras optimizer: iterations (int64) and learning_rate (float32)


@pytest.fixture(scope="module")
def tiny_adam():
    return Estimator(TINY, optimizer="adam")


def test_weights_gradients_and_adam_slots_match_hand_computation(tiny_adam):
    e = tiny_adam.at(16)
    assert (e.params_trainable, e.params_non_trainable) == (46, 0)
    assert e.weights == WEIGHTS
    assert e.optimizer_slots == 2 * WEIGHTS + SCALARS          # m and v per weight
    assert e.input_batch == 16 * (8 + 2) * 4                   # x and y, float32
    rows = {r.type + str(i): r for i, r in enumerate(e.layers)}
    first, second = e.layers
    assert (first.params_trainable, second.params_trainable) == (36, 10)
    assert (first.output_bytes, second.output_bytes) == (4 * 4, 2 * 4)   # per sample
    # The ReLU output is read by ReluGrad and by the second MatMul's gradient: kept.
    assert first.kept_bytes == 16 and second.kept_bytes == 0
    assert len(rows) == 2
    # The update runs each weight's chain depth first, as TensorFlow's executor does, so
    # the gradients are not all alive at once: at the peak at least the largest (the
    # first kernel, 8 x 4 float32) and less than every gradient with its Adam temporaries.
    assert 8 * 4 * 4 <= e.gradients < 3 * WEIGHTS
    assert e.total == e.model_bytes + e.baseline
    assert e.model_bytes == (e.weights + e.optimizer_slots + e.gradients + e.activations
                             + e.allocator + e.input_batch + e.pipeline + e.runtime
                             + e.margin)
    assert e.allocator_policy == "default"                  # a plain process by default


def test_the_loss_it_assumes_is_said_in_the_table_and_the_json(tiny_adam):
    """The step trains with MSE whatever the model's loss: said when the model has none
    (not compiled) or another one, not when its own is MSE."""
    from tests.estimate.models import tiny

    e = tiny_adam.at(16)
    [said] = e.assumptions
    assert said.startswith("loss mse on zero targets shaped like the outputs (the model "
                           "has no compiled loss as loaded")
    assert ".keras file" not in said             # a function's model, not a file
    assert "no option for another loss" in said
    assert f"assumed: {said}" in str(e).splitlines()[:5]
    assert e.to_json()["assumptions"] == [said]
    other, own = tiny(), tiny()
    other.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    own.compile(optimizer="adam", loss="mean_squared_error")
    [said] = Estimator(other).at(16).assumptions
    assert "in place of the model's compiled loss, sparse_categorical_crossentropy" in said
    assert Estimator(own).at(16).assumptions == ()


def test_activations_grow_linearly_with_the_batch(tiny_adam):
    small, big = tiny_adam.at(1000), tiny_adam.at(2000)
    per_sample = (big.step_peak - small.step_peak) / 1000
    # At least the kept ReLU output (16 B) and the output (8 B) per sample.
    assert 24 <= per_sample <= 200
    assert big.input_batch == 2 * small.input_batch


@pytest.mark.parametrize("name", [n for n in OPTIMIZERS if n != "adafactor"])
def test_slot_table_matches_the_optimizers_keras_builds(name):
    import keras

    variables = [keras.Variable(keras.ops.zeros((8, 4))), keras.Variable(keras.ops.zeros((4,)))]
    optimizer = make_optimizer(name)
    optimizer.build(variables)
    full = sum(1 for v in optimizer.variables if tuple(v.shape) in ((8, 4), (4,)))
    assert full == 2 * slots_per_weight(name), name
    assert slots_per_weight(optimizer) == slots_per_weight(name)


def test_sgd_keeps_no_slots_and_momentum_one():
    sgd = Estimator(TINY, optimizer="sgd").at(8)
    momentum = Estimator(TINY, optimizer="sgd+momentum").at(8)
    assert sgd.optimizer_slots == SCALARS
    assert momentum.optimizer_slots == WEIGHTS + SCALARS
    assert momentum.optimizer == "sgd+momentum"


def test_mixed_float16_keeps_float32_weights_and_halves_activations(tiny_adam):
    mixed = Estimator(TINY, optimizer="adam", dtype_policy="mixed_float16").at(16)
    plain = tiny_adam.at(16)
    assert mixed.dtype_policy == "mixed_float16"
    assert mixed.weights == plain.weights == WEIGHTS           # variables stay float32
    # The loss-scale optimizer adds its own scalars (step counter, scale...) to Adam's.
    assert 2 * WEIGHTS + SCALARS < mixed.optimizer_slots <= 2 * WEIGHTS + SCALARS + 32
    assert [r.output_bytes for r in mixed.layers] == [8, 4]    # float16 outputs
    assert mixed.input_batch == plain.input_batch              # inputs arrive as float32


@pytest.mark.parametrize("factory,shape", [("tiny_functional", None), ("nested", None),
                                           ("tiny_subclassed", (8,))])
def test_sequential_functional_nested_and_subclassed_agree(tiny_adam, factory, shape):
    e = memfit.estimate_memory(f"{MODELS}:{factory}", 16, optimizer="adam", input_shape=shape)
    plain = tiny_adam.at(16)
    assert (e.weights, e.optimizer_slots, e.input_batch) == (
        plain.weights, plain.optimizer_slots, plain.input_batch)
    assert [r.params_trainable for r in e.layers] == [36, 10]
    assert abs(e.step_peak - plain.step_peak) <= 256


def test_named_inputs_and_outputs_are_fed_as_the_dicts_the_model_takes():
    # A Functional model built on a dict of Inputs takes a dict: a list in model.inputs'
    # order (the keys sorted: image, table) was refused, and nothing could be estimated.
    e = memfit.estimate_memory(f"{MODELS}:named", 16, optimizer="sgd")
    per_sample = (8 + 6 * 6 * 2) * 4 + (1 + 5) * 4          # inputs + float32 targets
    assert e.input_batch == 16 * per_sample
    conv, dense = 3 * 3 * 2 * 3 + 3, 8 * 4 + 4
    assert e.params_trainable == conv + dense + (4 + 3) * 1 + 1 + (4 + 3) * 5 + 5
    assert e.step_peak > 0


def test_the_measured_step_feeds_named_inputs_and_targets_too():
    # The measuring child (find-batch-size, --measure) trains on make_batch's batch.
    from memfit.estimate.training import make_batch, prepare

    setup = prepare(f"{MODELS}:named", optimizer="sgd")
    x, y = make_batch(setup, 4)
    assert sorted(x) == ["image", "table"] and tuple(x["image"].shape) == (4, 6, 6, 2)
    assert sorted(y) == ["kind", "price"] and tuple(y["kind"].shape) == (4, 5)
    loss = setup.model.train_on_batch(x, y)
    assert float(loss if not isinstance(loss, list) else loss[0]) >= 0


def test_a_model_that_cannot_be_called_is_said_in_one_line():
    with pytest.raises(EstimateError) as info:
        memfit.estimate_memory(f"{MODELS}:call_fails", 4, input_shape=(8,))
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith("The model cannot be called on inputs of shape 8 (ValueError: ")
    assert "The input is not what this model takes." in message
    assert message.endswith("Check --input-shape.")


def test_a_live_model_and_keras_applications_work():
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    e = memfit.estimate_memory(model, 4, optimizer="sgd")
    assert e.weights == (8 * 3 + 3) * 4
    app = memfit.estimate_memory("keras.applications:MobileNetV3Small", 2,
                          input_shape=(32, 32, 3), optimizer="sgd")
    assert app.params_trainable > 1_000_000 and app.params_non_trainable > 0
    assert app.activations > 0 and len(app.layers) > 100


def test_budget_gives_the_largest_batch_and_advice(tiny_adam):
    e = tiny_adam.at(64)
    budget = e.total_high + 10_000 * 24            # room for a few thousand more samples
    fitted = tiny_adam.at(64, budget=budget)
    assert fitted.fits and fitted.max_batch_size > 64
    assert tiny_adam.at(fitted.max_batch_size).total_high <= budget
    assert tiny_adam.at(fitted.max_batch_size + 1).total_high > budget
    too_big = tiny_adam.at(fitted.max_batch_size * 4, budget=budget)
    assert too_big.fits is not True and too_big.verdict != "fits"
    assert any(f"batch size {fitted.max_batch_size}" in a for a in too_big.advice)
    nothing = tiny_adam.at(8, budget=tiny_adam.baseline + 1)    # the framework fits, no model
    assert nothing.max_batch_size == 0 and "not even batch size 1" in nothing.advice[0]


def test_dataset_budget_is_counted_as_the_pipeline():
    e = memfit.estimate_memory(TINY, 8, optimizer="sgd", dataset_budget="64MiB")
    assert e.pipeline == 64 * 2**20
    assert e.to_json()["pipeline"] == 64 * 2**20


@pytest.mark.parametrize("kwargs,message", [
    ({"batch_size": 0}, "batch_size=0"),
    ({"batch_size": -3}, "batch_size=-3"),
    ({"batch_size": 2.5}, "batch_size=2.5"),
    ({"optimizer": "adamx"}, "optimizer='adamx'"),
    ({"dtype_policy": "float8"}, "dtype_policy='float8'"),
])
def test_bad_arguments_are_clear_errors(kwargs, message):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(EstimateError, match=message.replace("(", r"\(")):
        memfit.estimate_memory(TINY, args.pop("batch_size"), **args)


def test_bad_models_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.keras"
    junk.write_text("not a model")
    with pytest.raises(EstimateError, match="is not a .keras file: a .keras file is a zip"):
        memfit.estimate_memory(str(junk), 4)
    with pytest.raises(EstimateError, match="No model file"):
        memfit.estimate_memory(str(tmp_path / "missing.keras"), 4)
    with pytest.raises(EstimateError, match="raised RuntimeError: the factory is broken"):
        memfit.estimate_memory(f"{MODELS}:raises", 4)
    with pytest.raises(EstimateError, match="returned str, not a keras.Model"):
        memfit.estimate_memory(f"{MODELS}:not_a_model", 4)
    with pytest.raises(EstimateError, match="has no attribute 'nope'"):
        memfit.estimate_memory(f"{MODELS}:nope", 4)
    with pytest.raises(EstimateError, match="--input-shape 224,224,3"):
        memfit.estimate_memory(f"{MODELS}:no_input_shape", 4)
    with pytest.raises(EstimateError, match="input_shape must be"):
        memfit.estimate_memory(f"{MODELS}:no_input_shape", 4, input_shape="a,b")


def test_a_model_not_found_is_said_before_tensorflow_is_imported(tmp_path):
    import subprocess
    import sys

    code = ("import sys, memfit\n"
            "for m in ('no_such_module_here:make', sys.argv[1]):\n"
            "    try:\n"
            "        memfit.estimate_memory(m, 4)\n"
            "    except memfit.estimate.EstimateError as e:\n"
            "        print(str(e).split(':')[0])\n"
            "from memfit.estimate.model import check_source\n"
            "check_source('keras.applications:MobileNetV2')   # found, not imported\n"
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "gone.keras")],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    missing = "Cannot import 'no_such_module_here' for model='no_such_module_here"
    assert out.splitlines() == [missing, f"No model file at '{tmp_path / 'gone.keras'}'",
                                "False False"]


def test_a_saved_keras_file_loads_and_matches(tmp_path):
    import keras

    from tests.estimate.models import tiny

    path = tmp_path / "tiny.keras"
    tiny().save(path)
    e = memfit.estimate_memory(str(path), 16, optimizer="adam")
    assert e.weights == WEIGHTS and e.optimizer_slots == 2 * WEIGHTS + SCALARS
    [said] = e.assumptions
    assert "a .keras file is loaded without its compile settings" in said
    # a float32 file estimated under mixed_float16 is rebuilt under it, as a factory is
    # (a stranger's .keras file kept its float32 activations)
    mixed = memfit.estimate_memory(str(path), 16, optimizer="adam",
                                   dtype_policy="mixed_float16")
    assert [r.output_bytes for r in mixed.layers] == [8, 4]     # float16 outputs
    assert [r.output_bytes for r in e.layers] == [16, 8]
    keras.backend.clear_session()


def test_a_model_whose_output_layer_stays_float32_is_not_rebuilt():
    """Keras's mixed-precision guide keeps the output layer in float32: that model is
    under mixed_float16 already, and its float32 layer stays float32."""
    import keras

    from memfit.estimate.model import policy_scope

    with policy_scope("mixed_float16"):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(2, dtype="float32")])
    e = memfit.estimate_memory(model, 16, optimizer="adam", dtype_policy="mixed_float16")
    assert [r.output_bytes for r in e.layers] == [8, 8]         # the float32 layer kept
    keras.backend.clear_session()

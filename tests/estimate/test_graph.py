"""The played step is the graph TensorFlow runs: the traced step after Grappler."""

import keras

from memfit.estimate import graph
from memfit.estimate.training import prepare


def conv() -> keras.Model:
    return keras.Sequential([keras.Input((16, 16, 3)),
                             keras.layers.Conv2D(8, 3, activation="relu"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])


def lstm() -> keras.Model:
    return keras.Sequential([keras.Input((12, 4)), keras.layers.LSTM(8),
                             keras.layers.Dense(1)])


def _step(factory, policy: str = "float32") -> graph.StepGraph:
    keras.backend.clear_session()
    return graph.trace(prepare(factory(), dtype_policy=policy))


def _assert_plays_in_dependency_order(step: graph.StepGraph) -> None:
    events = step._schedule()
    ran = [op.name for op, *_ in events]
    assert len(ran) == len(set(ran))
    position = {name: i for i, name in enumerate(ran)}
    producer = {t: op.name for op, *_ in events for t, _, _ in op.outputs}
    for op, *_ in events:
        for t in op.inputs:
            if t in producer:
                assert position[producer[t]] < position[op.name], (t, op.name)


def test_conv_bias_is_fused_and_keeps_its_size_and_scratch():
    step = _step(conv)
    traced = {op.name: op for op in step.ops}
    fused = [op for op in step.run_ops if op.type == "_FusedConv2D"]
    assert len(fused) == 1                        # Conv2D + BiasAdd (+ Relu) in one op
    op = fused[0]
    assert traced[op.name].type in ("BiasAdd", "Relu")
    assert op.outputs[0][1:] == traced[op.name].outputs[0][1:]   # 14 * 14 * 8 floats
    assert op.outputs[0][2] == 14 * 14 * 8 * 4
    # The convolution's reordered copy of its input (3 channels padded to 16).
    assert op.inner[1] >= 16 * 16 * 16 * 4
    assert not any(o.type == "Conv2D" and not o.name.startswith("gradient_tape/")
                   for o in step.run_ops)
    _assert_plays_in_dependency_order(step)


def test_the_loss_scale_branch_is_inlined_and_played_in_order():
    step = _step(conv, "mixed_float16")
    assert any(op.type in ("If", "StatelessIf") for op in step.ops)
    assert not any(op.type in ("If", "StatelessIf") for op in step.run_ops)
    assert any(op.type in ("Switch", "Merge") for op in step.run_ops)
    _assert_plays_in_dependency_order(step)
    assert step.peak(64).bytes > step.peak(8).bytes > 0


def test_a_while_loop_stays_one_op_with_its_accumulators():
    step = _step(lstm)
    loops = [op for op in step.run_ops if op.type in ("While", "StatelessWhile")]
    assert len(loops) == 2                        # forward and its gradient
    assert not any(op.type == "NextIteration" for op in step.run_ops)
    traced = {op.name: op for op in step.ops}
    for op in loops:
        assert (op.extra, op.inner) == (traced[op.name].extra, traced[op.name].inner)
    forward = next(op for op in loops if not op.name.startswith("gradient_tape/"))
    assert forward.extra[1] > 0                   # what each time step keeps, per sample
    _assert_plays_in_dependency_order(step)


def test_grappler_failing_falls_back_to_the_traced_graph(monkeypatch):
    from tensorflow.python.grappler import tf_optimizer

    def broken(*args, **kwargs):
        raise RuntimeError("grappler is broken on purpose")

    monkeypatch.setattr(tf_optimizer, "OptimizeGraph", broken)
    step = _step(conv)
    assert step.run_ops is step.ops
    assert step.peak(32).bytes > 0


def test_grappler_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(graph, "GRAPPLER", False)
    step = _step(conv)
    assert step.run_ops is step.ops
    assert any(op.type == "Conv2D" for op in step.run_ops)

"""The played step is the graph TensorFlow runs: the traced step after Grappler."""

import itertools

import keras

from memfit.estimate import graph, kernels
from memfit.estimate.schedule import BREADTH_FIRST, ORDERS, Executor, Op
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
    # Each op has two events: its start, then its end. It starts after its inputs ended.
    seen: dict[str, int] = {}
    started: dict[str, int] = {}
    ended: dict[str, int] = {}
    for i, (op, *_) in enumerate(step.schedule(64)):
        seen[op.name] = seen.get(op.name, 0) + 1
        (started if seen[op.name] == 1 else ended)[op.name] = i
    assert set(seen.values()) == {2} and started.keys() == ended.keys()
    ops = {op.name: op for op in step.run_ops}
    producer = {t: name for name in started for t, _, _ in ops[name].outputs}
    for name, i in started.items():
        for t in ops[name].inputs:
            if t in producer:
                assert ended[producer[t]] < i, (t, name)


def test_conv_bias_is_fused_and_keeps_its_size():
    step = _step(conv)
    traced = {op.name: op for op in step.ops}
    fused = [op for op in step.run_ops if op.type == "_FusedConv2D"]
    assert len(fused) == 1                        # Conv2D + BiasAdd (+ Relu) in one op
    op = fused[0]
    assert traced[op.name].type in ("BiasAdd", "Relu")
    assert op.outputs[0][1:] == traced[op.name].outputs[0][1:]
    assert op.outputs[0][2] == 14 * 14 * 8 * 4    # per sample: 14 x 14 x 8 floats
    # It runs as long as the convolution it swallowed (2 x 3*3*3 multiply-adds/output).
    assert op.cost[1] >= 2 * 27 * 14 * 14 * 8
    assert not any(o.type == "Conv2D" and not o.name.startswith("gradient_tape/")
                   for o in step.run_ops)
    _assert_plays_in_dependency_order(step)


def test_the_filter_gradient_holds_an_im2col_buffer_of_a_shard_of_images():
    step = _step(conv)
    (grad,) = [op for op in step.run_ops if op.type == "Conv2DBackpropFilter"]
    column = 14 * 14 * (3 * 3 * 3) * 4            # one image: output pixels x filter
    work = column + (14 * 14 + 27) * 8 * 4
    shard = -(-30 * 2**20 // work)                 # images in TensorFlow's 30 MiB "L3"
    assert grad.workspace == (0, column, shard * column)
    # A batch smaller than the shard touches only its own images' pages.
    small, big = step.peak(2, 131072), step.peak(4 * shard, 131072)
    assert small.bytes < shard * column < big.bytes


def pooled() -> keras.Model:
    return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),
                             keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                             keras.layers.Dense(2)])


def test_onednn_kernels_hold_no_im2col_buffer_and_a_byte_per_pooled_element():
    # Measured one op at a time with get_memory_info, oneDNN on: a float32 convolution
    # gradient allocates only its result; MaxPoolGrad runs the pooling again (its output
    # and a one-byte workspace per element) instead of TensorFlow's int64 argmax + copy.
    keras.backend.clear_session()
    setup = prepare(pooled())
    ours, theirs = graph.trace(setup), graph.trace(setup, onednn=True)
    grads = {op.type: op.workspace for op in theirs.run_ops
             if op.type in ("Conv2DBackpropFilter", "MaxPoolGrad")}
    pooled_bytes = 7 * 7 * 8 * 4                  # the pooled output, per sample
    assert grads == {"Conv2DBackpropFilter": (0, 0, 0),
                     "MaxPoolGrad": (0, pooled_bytes + pooled_bytes // 4, 0)}
    mine = {op.type: op.workspace for op in ours.run_ops
            if op.type in ("Conv2DBackpropFilter", "MaxPoolGrad")}
    assert mine["Conv2DBackpropFilter"][1] > 0 and mine["MaxPoolGrad"] == (0, 3 * pooled_bytes, 0)
    assert theirs.peak(256, 131072).bytes < ours.peak(256, 131072).bytes
    # float16 convolutions and pooling stay TensorFlow's (no float16 oneDNN kernels here).
    keras.backend.clear_session()
    half = graph.trace(prepare(pooled(), dtype_policy="mixed_float16"), onednn=True)
    (grad,) = [op for op in half.run_ops if op.type == "Conv2DBackpropFilter"]
    assert grad.workspace[1] > 0


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


def test_off_the_cpu_the_traced_graph_is_played_without_cpu_kernel_buffers():
    keras.backend.clear_session()
    step = graph.trace(prepare(conv()), cpu=False)
    assert step.run_ops is step.ops
    assert any(op.type == "Conv2D" for op in step.run_ops)
    assert all(op.workspace == (0, 0, 0) for op in step.run_ops)


def _op(index: int, name: str, inputs: list[str], scratch: int, cost: int) -> Op:
    return Op(index=index, name=name, type="Mul", inputs=inputs, controls=[],
              outputs=[(f"{name}:0", 1024, 0)], workspace=(scratch, 0, 0), cost=(cost, 0))


def test_two_executor_threads_hold_two_ready_ops_at_once():
    # x feeds a (long, 10 MiB of kernel workspace) and b (short, 20 MiB): with two
    # threads both run at once, with one they take turns.
    mib = 2**20
    ops = [_op(0, "x", [], 0, 1), _op(1, "a", ["x:0"], 10 * mib, 1000),
           _op(2, "b", ["x:0"], 20 * mib, 10), _op(3, "out", ["a:0", "b:0"], 0, 1)]
    peaks = {}
    for threads in (1, 2):
        peaks[threads] = graph.StepGraph(ops, {"out:0"}, len(ops), threads=threads).peak(8)
    tensors = 3 * 1024                                      # x, a and b's outputs
    # One thread: a first (the thread goes on with the last op x made ready), then b,
    # whose element-wise output takes over x's buffer: a has ended, b is x's last reader.
    assert peaks[1].bytes == 20 * mib + 2 * 1024 and peaks[1].op == "b"
    assert peaks[2].bytes == 30 * mib + tensors and peaks[2].op == "b"


def test_a_thread_follows_one_chain_depth_first_and_an_idle_thread_steals_the_other():
    # g feeds two chains, p -> q and r -> s. The thread that ran g goes on with the last
    # op it made ready (TensorFlow's executor runs it inline) and then with what that
    # one made ready; the other chain waits in the thread's queue, and a second thread
    # takes it from the back.
    ops = [_op(0, "g", [], 0, 1), _op(1, "p", ["g:0"], 0, 10), _op(2, "q", ["p:0"], 0, 10),
           _op(3, "r", ["g:0"], 0, 10), _op(4, "s", ["r:0"], 0, 10),
           _op(5, "out", ["q:0", "s:0"], 0, 1)]
    one = Executor(ops, {"out:0"}, threads=1, batch_size=1)
    order = [e.op.name for e in one.play()][::2]            # one thread: start, end, ...
    first = order[1]
    then = {"p": "q", "r": "s"}
    assert order[:3] == ["g", first, then[first]]          # one chain, depth first
    two = Executor(ops, {"out:0"}, threads=2, batch_size=1)
    two.play()
    assert two.thread_of["g"] == two.thread_of[first] == two.thread_of[then[first]]
    other = "r" if first == "p" else "p"
    assert two.thread_of[other] == two.thread_of[then[other]] != two.thread_of["g"]
    # Breadth first (the high end's second play): both chains' first ops, then the rest.
    wide = Executor(ops, {"out:0"}, threads=1, batch_size=1, order=BREADTH_FIRST)
    assert [e.op.name for e in wide.play()][::2] == ["g", "p", "r", "q", "s", "out"]


def test_a_weight_gradient_matmul_takes_longer_with_the_batch():
    # Dense(2) on 8 features: its kernel's gradient is x^T (b x 8) . dy (b x 2), a sum
    # over the batch: its work grows with the batch though its output does not.
    step = _step(conv)
    grads = [op for op in step.run_ops if op.type == "MatMul"
             and op.name.startswith("gradient_tape/") and op.outputs[0][1:] == (8 * 2 * 4, 0)]
    assert len(grads) == 1
    fixed, per = grads[0].cost
    assert per >= 2 * 8 * 2                               # multiply-adds per sample
    assert fixed <= kernels.OP_COST + kernels.BYTE_COST * 8 * 2 * 4


def bigru() -> keras.Model:
    return keras.Sequential([keras.Input((12, 4)), keras.layers.Dense(4),   # a gradient in
                             keras.layers.Bidirectional(keras.layers.GRU(8)),
                             keras.layers.Dense(1)])


def test_a_recurrent_layers_input_lists_live_through_its_gradient_loop():
    # Each direction unstacks its input sequence into a TensorList of 12 tensors (a
    # copy); the loop's accumulators reference its elements until the gradient loop
    # ends, and that loop fills a list of zeros of the same tensors. TensorFlow's BFC
    # allocator holds all of them at the peak of bigru_text's step at batch 256 (60 MiB of
    # 182 MiB); the play now holds 183.7 MiB there, 123.6 MiB without them.
    step = _step(bigru)
    per_list = 12 * 4 * 4                          # per sample: 12 steps x 4 floats
    run = {op.name: op for op in step.run_ops}
    lists = [op for op in run.values() if op.type == "TensorListFromTensor"
             and not op.name.startswith("gradient_tape/")]
    zeros = [op for op in run.values() if op.type == "ZerosLike"
             and op.extra != (0, 0)]
    assert len(lists) == len(zeros) == 2          # one per direction
    assert {(op.extra, op.extra_items) for op in lists + zeros} == {((0, per_list), 12)}
    forward = [op for op in run.values() if op.type in ("While", "StatelessWhile")
               and not op.name.startswith("gradient_tape/")]
    assert all(op.referenced for op in forward)   # it keeps the elements it read
    # When a direction's gradient loop starts, both directions' lists are alive.
    live: dict[int, tuple[str, int]] = {}
    for op, allocated, freed in step.schedule(64):
        for b in allocated:
            live[b.id] = (b.owner, b.per)
        if op.type in ("While", "StatelessWhile") and op.name.startswith("gradient_tape/"):
            held = sum(per for owner, per in live.values()
                       if owner in {o.name for o in lists + zeros})
            assert held == 4 * per_list
            break
        for b in freed:
            live.pop(b)
    else:
        raise AssertionError("no gradient loop was played")
    _assert_plays_in_dependency_order(step)


def cross_attention() -> keras.Model:
    q, kv = keras.Input((6, 8)), keras.Input((10, 8))
    y = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(q, kv)
    return keras.Model([q, kv], keras.layers.Dense(1)(keras.layers.Flatten()(y)))


def test_attention_einsums_hold_their_transposed_operands():
    # TensorFlow's CPU Einsum transposes BTNH and BSNH into batch-first copies before
    # multiplying (BFC: 12 MiB for the keys of cross_attention at batch 512).
    step = _step(cross_attention)
    scores = [op for op in step.run_ops if op.type == "Einsum"
              and not op.name.startswith("gradient_tape/")]
    q, k, out = 6 * 2 * 4 * 4, 10 * 2 * 4 * 4, 6 * 2 * 4 * 4      # per sample
    assert {op.workspace for op in scores} == {
        (0, q + k, 0),            # BTNH,BSNH->BNTS: both operands copied
        (0, k + out, 0),          # BNTS,BSNH->BTNH: the values, and BNTH out of a temporary
    }


def simple_rnn() -> keras.Model:
    return keras.Sequential([keras.Input((12, 4)), keras.layers.SimpleRNN(8),
                             keras.layers.Dense(1)])


def test_a_state_pushed_to_two_lists_is_one_buffer_per_time_step():
    # A SimpleRNN writes each step's state to its output list and pushes the same
    # tensor to the gradient's accumulator: two references to one buffer (TensorFlow's
    # BFC allocator holds 25 MiB of them at batch 512 over 100 steps of 128 units; the
    # play held 50 MiB).
    step = _step(simple_rnn)
    (forward,) = [op for op in step.run_ops if op.type in ("While", "StatelessWhile")
                  and not op.name.startswith("gradient_tape/")]
    assert forward.extra == (0, 12 * 8 * 4)       # per sample: 12 steps x 8 floats


def bag_of_words() -> keras.Model:
    return keras.Sequential([keras.Input((30,), dtype="int32"),
                             keras.layers.Embedding(6000, 16),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])


def test_adams_two_segment_sums_of_a_sparse_gradient_overlap():
    # Adam sums an embedding's sparse gradient into a dense table twice (for m, and for
    # v from its square). UnsortedSegmentSum zero-fills the table, then reads and writes
    # a table row per gradient row: it outlasts the Square beside it, so the second sum
    # starts while the first runs and both tables are alive (TensorFlow's BFC allocator
    # at bag_of_words' peak at batch 256: 2 x 29.3 MiB; the play held one).
    keras.backend.clear_session()
    step = graph.trace(prepare(bag_of_words()), threads=2)
    sums = {op.name for op in step.run_ops if op.type == "UnsortedSegmentSum"}
    assert len(sums) == 2
    data, table = 30 * 16 * 4, 6000 * 16 * 4           # per sample; fixed
    assert all(op.cost[0] >= kernels.BYTE_COST * 2 * table
               and op.cost[1] >= kernels.BYTE_COST * 3 * data
               for op in step.run_ops if op.name in sums)
    live: dict[int, str] = {}
    both = False
    for _op, allocated, freed in step.schedule(8192):   # kernels' own time dominates
        live.update((b.id, b.owner) for b in allocated)
        both = both or sums <= set(live.values())
        for b in freed:
            live.pop(b)
    assert both
    _assert_plays_in_dependency_order(step)


def test_a_held_plays_curve_gives_the_peaks_the_play_gives_at_every_batch_size():
    # The estimate's high end reads a held play (order and glibc's split taken at one
    # batch size) at many batch sizes from its curve instead of playing it again: the
    # same integers as the play, with capped kernel workspaces (TensorFlow's filter
    # gradient), oneDNN's pool, glibc's dynamic and fixed thresholds, one and two
    # executor threads, and batch sizes on both sides of the split.
    keras.backend.clear_session()
    setup = prepare(conv())
    steps = [graph.trace(setup), graph.trace(setup, onednn=True), _step(lstm), _step(bigru)]
    steps[3].threads = 1
    kept, inputs = [4096, 65536], [16 * 16 * 3 * 4]
    compared = 0
    for step in steps:
        for threshold in (None, 131072):
            for pool in (False, True):
                extra = dict(pool=True, kept=kept, step_inputs=inputs) if pool else {}
                for played_at, order in itertools.product((1, 4, 16), ORDERS):
                    for batch in (played_at, played_at + 1, 3 * played_at, 64, 9000):
                        p = step.peak(batch, threshold, played_at=played_at, order=order,
                                      **extra)
                        got = step.held_peak(batch, played_at, threshold, order=order,
                                             **extra)
                        assert got == (p.bytes, p.heap_bytes, p.mmap_bytes, p.pool_bytes), \
                            (step.threads, threshold, pool, played_at, batch, order)
                        compared += 1
    assert compared == 4 * 2 * 2 * 3 * 2 * 5
    # The filter gradient's workspace is capped at a shard of images that batch 9000
    # passes (its pages beyond are never touched).
    (grad,) = [op for op in steps[0].run_ops if op.type == "Conv2DBackpropFilter"]
    assert 0 < grad.workspace[2] < grad.workspace[1] * 9000

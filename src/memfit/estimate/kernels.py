"""The kernels' rules: what each TensorFlow op allocates, shares or writes over, and how long
it runs. The play of the step (:mod:`memfit.estimate.schedule`) follows these rules; the
graph (:mod:`memfit.estimate.graph`) reads them off each traced op.

* **Sizes.** The step is traced on a batch of :data:`PROBE_BATCH` samples: a tensor with
  a dimension that is a multiple of it is batch-sized. :func:`tensor_sizes` gives each
  tensor as ``(fixed, per-sample)`` bytes, so its size at any batch size is
  ``fixed + per_sample × batch``.
* **Views** (:data:`VIEWS`: ``Identity``, ``Reshape``, ``ReadVariableOp``...) share their
  input's buffer. **Element-wise ops** (:data:`FORWARDING`) may write over an input
  buffer that nobody else needs: TensorFlow forwards such buffers in place.
* **Kernel buffers.** :func:`workspace` is the working buffer a CPU kernel allocates while
  it runs (the im2col buffer of a convolution gradient, ``MaxPoolGrad``'s argmax);
  :func:`widening` the float32 copies a float16 MatMul makes on a CPU without float16
  arithmetic.
* **TensorLists.** A list is a ``variant``: it holds tensors the traced shape does not
  show. :func:`list_buffer` sizes the lists an op fills (``TensorListFromTensor`` copies
  its tensor into one element per row; ``ZerosLike`` of a list is a list of zeros).
* **Durations.** :func:`cost` estimates how long an op runs, in multiply-adds: it decides
  which ops TensorFlow's executor threads run together.
* **Pure ops** (:data:`PURE`) have no side effects: Grappler prunes them when nobody
  reads their results.

Example:
    >>> tensor_bytes(0, 4096, 0, batch_size=8)
    32768
    >>> tensor_bytes(0, 4096, 10_000, batch_size=8)        # a workspace touching 10 kB
    10000
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["PROBE_BATCH", "BYTE_COST", "OP_COST", "VIEWS", "FORWARDING", "CONVOLUTIONS",
           "MATMULS", "PURE", "LOOPS", "tensor_bytes", "tensor_sizes", "workspace",
           "widening", "cost", "list_buffer", "list_items", "einsum_copies", "ONEDNN_DTYPES"]

PROBE_BATCH = 997          # a prime that no layer dimension is likely to be a multiple of
# An op's duration (see cost): a byte moved costs as much as this many multiply-adds,
# and every op this many more (the executor's own work per op).
BYTE_COST = 8
OP_COST = 100_000

MATMULS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul"}
# Ops whose output is a view of input 0: no new memory.
VIEWS = {"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
         "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast",
         "ReadVariableOp", "_Retval", "Placeholder", "OptionalFromValue",
         "OptionalGetValue", "TensorListGetItem", "TensorListPopBack", "Switch", "Merge"}
# Element-wise ops that TensorFlow lets write over an input buffer nobody else needs.
FORWARDING = {"Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign",
              "Neg", "Square", "Sqrt", "Rsqrt", "Exp", "Log", "Abs", "Reciprocal",
              "AddV2", "Add", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum",
              "Minimum", "SquaredDifference", "BiasAdd", "ReluGrad", "Relu6Grad", "EluGrad",
              "SeluGrad", "SigmoidGrad", "TanhGrad", "RsqrtGrad", "SqrtGrad", "Pow",
              "FloorMod", "FloorDiv", "AddN", "Cast", "LeakyRelu", "LeakyReluGrad",
              "MulNoNan", "Erf", "Softmax", "ClipByValue", "SelectV2", "Select",
              "OnesLike", "ZerosLike", "Sign", "Floor", "Ceil", "Round", "Log1p", "Expm1",
              "Sin", "Cos", "Inv", "InvGrad", "SoftplusGrad", "SoftsignGrad", "GeluGrad"}
# Convolutions (their arithmetic is counted by cost).
CONVOLUTIONS = {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
                "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "DepthwiseConv2dNative",
                "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
                "_FusedConv2D"}
# Ops without side effects: Grappler prunes them when nobody reads their results.
PURE = (FORWARDING | CONVOLUTIONS | MATMULS | (VIEWS - {"Placeholder", "_Retval"})
        | {"Tile", "BroadcastTo", "Transpose", "Pad", "Sum", "Mean", "Prod", "Max", "Min",
           "ConcatV2", "Slice", "StridedSlice", "GatherV2", "ResourceGather", "Fill",
           "Shape", "ShapeN", "Size", "Rank", "Const", "Pack", "Unpack", "Split", "SplitV",
           "BiasAddGrad", "MaxPool", "MaxPoolGrad", "AvgPool", "AvgPoolGrad",
           "FusedBatchNormV3", "FusedBatchNormGradV3", "Conv2DBackpropInput",
           "DepthwiseConv2dNativeBackpropInput", "UnsortedSegmentSum", "Range",
           "BroadcastGradientArgs", "Reshape", "Cast", "Tanh", "Sigmoid"})
LOOPS = {"While", "StatelessWhile"}
# The convolution gradients whose CPU kernels size their im2col buffers to a cache size.
_CONV_GRADS = {"Conv2DBackpropFilter", "Conv2DBackpropInput"}
_L3_BYTES = 30 * 2**20
_L2_BYTES = 256 * 2**10
#: The dtypes oneDNN's CPU kernels take over from TensorFlow's for convolutions and pooling
#: when oneDNN is on (float16 ones stay TensorFlow's on a CPU without float16 units).
ONEDNN_DTYPES = {"float32", "bfloat16"}
# Scatter reductions: an output row is read and written for each data row (see cost).
_SCATTERS = {"UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin",
             "UnsortedSegmentProd"}
_NO_MEMORY_DTYPES = {"resource", "variant", "string"}


def tensor_bytes(fixed: int, per: int, cap: int, batch_size: int) -> int:
    """A buffer's size at ``batch_size``; a workspace touches at most ``cap`` bytes
    (pages never written are not resident; 0: no cap).

    Args:
        fixed: bytes whatever the batch size.
        per: bytes per sample.
        cap: the most bytes touched, or 0.
        batch_size: samples per step.
    """
    size = fixed + per * batch_size
    return min(size, cap) if cap else size


def tensor_sizes(tensor: Any) -> tuple[int, int]:
    """A traced tensor's bytes as ``(fixed, per-sample)``; ``(0, 0)`` for a tensor that
    holds no memory of its own (a resource, a variant) or whose shape is not known."""
    dtype = tensor.dtype
    if dtype.name in _NO_MEMORY_DTYPES or tensor.shape.rank is None:
        return 0, 0
    dims = tensor.shape.as_list()
    if any(d is None for d in dims):
        return 0, 0
    n = 1
    for d in dims:
        n *= d
    size = n * dtype.size
    if any(d > 0 and d % PROBE_BATCH == 0 for d in dims):
        return 0, size // PROBE_BATCH
    return size, 0


def list_buffer(op: Any) -> tuple[int, int, int]:
    """The tensors a TensorList op allocates into the list it makes, as ``(fixed,
    per-sample, how many)``; ``(0, 0, 0)`` for any other op. ``TensorListFromTensor``
    (a recurrent layer's input sequence, unstacked into one tensor per time step) copies
    its tensor; ``ZerosLike`` of a list (the gradient of a list a loop passes through
    untouched) fills a list of the same tensors with zeros. Both lists are alive through
    the backward pass of a recurrent layer (a bidirectional GRU over 80 steps of 128
    features holds 10 MiB of each per direction at batch 256, in TensorFlow's BFC
    allocator)."""
    if op.type == "TensorListFromTensor":
        return list_items(op.outputs[0])
    if op.type == "ZerosLike" and op.outputs and op.outputs[0].dtype.name == "variant":
        return list_items(op.inputs[0])
    return 0, 0, 0


def list_items(tensor: Any, depth: int = 0) -> tuple[int, int, int]:
    """What the TensorList ``tensor`` holds as ``(fixed, per-sample, how many)``, when
    it was filled by ``TensorListFromTensor``, followed back through the ops that pass a
    list on (a loop carries it from its input to the output of the same index);
    ``(0, 0, 0)`` otherwise (a list a loop fills or empties as it runs).

    Args:
        tensor: a traced ``variant`` tensor.
        depth: how many ops were followed so far."""
    op = tensor.op
    if depth > 16:
        return 0, 0, 0
    if op.type == "TensorListFromTensor":
        source = op.inputs[0]
        f, p = tensor_sizes(source)
        dims = source.shape.as_list() if source.shape.rank else []
        return (f, p, dims[0]) if dims and dims[0] else (0, 0, 0)
    if op.type in ("ZerosLike", "Identity"):
        return list_items(op.inputs[0], depth + 1)
    if op.type in LOOPS and tensor.value_index < len(op.inputs):
        return list_items(op.inputs[tensor.value_index], depth + 1)
    return 0, 0, 0


def widening(op: Any) -> tuple[int, int]:
    """float32 copies a CPU kernel makes of float16 operands (no float16 arithmetic): a
    float16 MatMul multiplies float32 copies of its inputs into a float32 output, then
    narrows it (seen in TensorFlow's allocator during a mixed_float16 step). float16
    convolutions work in float16 (their im2col buffers are float16)."""
    if not op.outputs or op.outputs[0].dtype.name != "float16" or op.type not in MATMULS:
        return 0, 0
    parts = [tensor_sizes(t) for t in list(op.inputs) + list(op.outputs)]
    return 2 * sum(f for f, _ in parts), 2 * sum(p for _, p in parts)


def workspace(op: Any, threads: int, onednn: bool = False) -> tuple[int, int, int]:
    """The buffer a CPU kernel of the training step allocates while it runs, as (fixed,
    per-sample, most bytes touched). With TensorFlow's own kernels:

    * the gradients of a 2-D convolution multiply through an im2col buffer of ``shard``
      images sized to a 30 MiB "L3 cache" (TensorFlow's conv_grad_*_ops.cc: a 32->64
      channel 3x3 filter gradient on 30x30 outputs holds [24, 900, 288] floats); only
      the images of the batch are written, so a small batch touches fewer pages. The
      input gradient uses one image's buffer when each of the ``threads`` executor
      threads' share of the work is above a 256 KiB "L2 cache";
    * MaxPoolGrad recomputes the argmax (int64) and copies the pooled output;
    * an Einsum (attention's scores and their gradients) multiplies as a batched
      MatMul: each operand whose labels are not in its order is first transposed into a
      copy, and a result whose labels are not in the output's order is transposed out of
      a temporary (:func:`einsum_copies`).

    The forward convolution (Eigen) and the depthwise kernels pack in cache-sized
    blocks: nothing batch-sized.

    With ``onednn`` (TensorFlow's default on x86), float32 and bfloat16 convolutions and
    pooling run oneDNN's kernels (:data:`ONEDNN_DTYPES`; measured one op at a time with
    ``get_memory_info``): a convolution gradient allocates nothing beyond its result
    (no im2col buffer), and ``MaxPoolGrad`` runs the pooling again into a pooled
    output and a one-byte-per-element workspace.

    Args:
        op: a ``tf.Operation`` of the traced step.
        threads: TensorFlow's executor threads.
        onednn: the training process runs oneDNN's kernels.
    """
    try:
        mkl = bool(onednn and op.outputs and op.outputs[0].dtype.name in ONEDNN_DTYPES)
        if op.type == "MaxPoolGrad":
            f, p = tensor_sizes(op.inputs[1])
            size = op.inputs[1].dtype.size or 8
            if mkl:
                return f + f // size, p + p // size, 0
            widen = 1 + 8 // size
            return f * widen, p * widen, 0
        if op.type == "Einsum":
            return (*einsum_copies(op), 0)
        if op.type not in _CONV_GRADS or mkl:
            return 0, 0, 0
        out = op.inputs[2].shape.as_list()
        filt = (op.outputs[0] if op.type == "Conv2DBackpropFilter"
                else op.inputs[1]).shape.as_list()
        filter_total = filt[0] * filt[1] * filt[2]
        output_image = out[1] * out[2]
        size = op.outputs[0].dtype.size
    except (IndexError, TypeError, ValueError):
        return 0, 0, 0
    if not (filter_total and output_image and size):
        return 0, 0, 0
    column = output_image * filter_total * size       # one image's im2col buffer
    work = column + (output_image + filter_total) * filt[3] * size
    if op.type == "Conv2DBackpropInput" and work // threads >= _L2_BYTES:
        return column, 0, 0                           # a parallel contraction per image
    shard = -(-_L3_BYTES // work)
    return 0, column, shard * column


def einsum_copies(op: Any) -> tuple[int, int]:
    """The copies TensorFlow's CPU Einsum kernel (linalg/einsum_op_impl.h) makes of a
    two-operand equation, as ``(fixed, per-sample)`` bytes: it labels each letter batch
    (in both operands and the output), free (in one operand and the output) or contract
    (in both operands only), transposes each operand into batch, free, contract order
    (or batch, contract, free: a transposed MatMul) unless it is in that order already,
    multiplies into a temporary in batch, free-of-the-first, free-of-the-second order and
    transposes that into the output unless it is in that order already. Each copy is
    alive until the kernel returns. Multi-head attention's ``BTNH,BSNH->BNTS`` copies
    both operands (the 4 heads of 96 keys at batch 512: 12 MiB).

    Example:
        >>> import tensorflow as tf
        >>> f = tf.function(lambda q, k: tf.einsum("BTNH,BSNH->BNTS", q, k))
        >>> g = f.get_concrete_function(tf.TensorSpec((2, 3, 4, 5)),
        ...                             tf.TensorSpec((2, 6, 4, 5))).graph
        >>> einsum_copies([o for o in g.get_operations() if o.type == "Einsum"][0])
        (1440, 0)

    (both operands copied: 2·3·4·5 + 2·6·4·5 floats.)
    """
    equation = op.get_attr("equation").decode()
    operands, _, result = equation.replace(" ", "").partition("->")
    terms = operands.split(",")
    if (len(terms) != 2 or "." in equation or any(len(set(t)) != len(t) for t in terms)
            or any(c not in result for c in set(terms[0]) ^ set(terms[1]))):
        return 0, 0                  # broadcasting, a diagonal, a sum: not followed
    ids = {c: i for i, c in enumerate(dict.fromkeys(terms[0] + terms[1] + result))}
    batch, free, contract = 1, 2, 3

    def kind(c: str) -> int:
        both = c in terms[0] and c in terms[1]
        return (batch if c in result else contract) if both else free

    fixed = per = 0
    frees = []
    for tensor, term in zip(op.inputs, terms, strict=True):
        order = sorted(term, key=lambda c: (kind(c), ids[c]))
        swapped = sorted(term, key=lambda c: ({free: contract, contract: free}.get(
            kind(c), kind(c)), ids[c]))
        frees += [c for c in order if kind(c) == free]
        if list(term) not in (order, swapped):
            f, p = tensor_sizes(tensor)
            fixed, per = fixed + f, per + p
    product = sorted((c for c in result if kind(c) == batch), key=ids.get) + frees
    if product != list(result):
        f, p = tensor_sizes(op.outputs[0])
        fixed, per = fixed + f, per + p
    return fixed, per


def cost(op: Any) -> tuple[int, int]:
    """How long ``op`` runs, as (fixed, per-sample) multiply-adds: a convolution's or a
    MatMul's arithmetic, plus :data:`BYTE_COST` per byte it reads and writes, plus
    :data:`OP_COST`. Only the ratios between ops matter (they decide what runs together
    on the executor's threads). A scatter reduction (``UnsortedSegmentSum``: Adam's sum
    of an embedding's sparse gradient into a dense table) also zero-fills its output and
    reads and writes an output row per data row: it outlasts the element-wise ``Square``
    beside it, so Adam's second sum starts while the first runs (both 29.3 MiB tables
    are alive at bag_of_words' peak at batch 256 in TensorFlow's BFC allocator)."""
    fixed, per = OP_COST, 0
    for t in list(op.inputs) + list(op.outputs):
        f, p = tensor_sizes(t)
        fixed, per = fixed + BYTE_COST * f, per + BYTE_COST * p
    try:
        if op.type in CONVOLUTIONS:
            f, p = _convolution_work(op)
        elif op.type in MATMULS:
            f, p = _matmul_work(op)
        else:
            f, p = 0, 0
    except (ValueError, IndexError, TypeError):     # a shape we cannot read: bytes only
        f, p = 0, 0
    if op.type in _SCATTERS and op.inputs and op.outputs:
        # it fills its output first, then reads and writes an output row per data row
        out, data = tensor_sizes(op.outputs[0]), tensor_sizes(op.inputs[0])
        f += BYTE_COST * (out[0] + 2 * data[0])
        p += BYTE_COST * (out[1] + 2 * data[1])
    return fixed + f, per + p


def _convolution_work(op: Any) -> tuple[int, int]:
    """A convolution's multiply-adds: 2 x (filter elements / output channels) per element
    of the activation side."""
    if "BackpropFilter" in op.type:
        act, filt = op.inputs[2], op.outputs[0]
    elif "BackpropInput" in op.type:
        act, filt = op.inputs[2], op.inputs[1]
    else:
        act, filt = op.outputs[0], op.inputs[1]
    f, p = tensor_sizes(act)
    dims = filt.shape.as_list()
    channels = act.shape.as_list()[-1]
    if not (channels and all(dims) and act.dtype.size):
        return 0, 0
    weights = 1
    for d in dims:
        weights *= d
    k = 2 * weights // channels // act.dtype.size
    return k * f, k * p


def _matmul_work(op: Any) -> tuple[int, int]:
    """A MatMul's multiply-adds: 2 x the inner dimension per output element; a product
    summed over the batch (a weight gradient) grows with the batch though its output
    does not."""
    a = op.inputs[0]
    adjoint = False
    for attr in ("transpose_a", "adj_x"):
        with contextlib.suppress(ValueError, TypeError):
            adjoint = bool(op.get_attr(attr))
    dims = a.shape.as_list()
    inner = dims[-2] if adjoint else dims[-1]
    f, p = tensor_sizes(op.outputs[0])
    size = op.outputs[0].dtype.size
    if inner and size and inner % PROBE_BATCH == 0:    # summed over the batch
        return 0, 2 * inner // PROBE_BATCH * f // size
    if inner and size:
        return 2 * inner * f // size, 2 * inner * p // size
    return 0, 0

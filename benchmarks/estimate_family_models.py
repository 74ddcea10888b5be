"""The architectures of the family panel (``benchmarks/estimate_families.py``).

Every factory builds its model in code, with random weights (``weights=None`` for
``keras.applications``), small enough that one measured case runs in seconds on a
2-core CPU. A measuring child imports them as
``benchmarks/estimate_family_models.py:NAME``.

:data:`FAMILIES` maps each family to its cases: ``(name, batch sizes, input shape)``
(the input shape only for a model that does not know it). :data:`IN_OLD_PANEL` says
which families had a model in the 60-case panel the estimator's constants were fitted
on (``benchmarks/estimate_accuracy.py``); every other family is out of family already.

Example:
    >>> sorted(FAMILIES)[:3]                                        # doctest: +SKIP
    ['attention', 'classic_cnn', 'conv1d_audio']
"""

from __future__ import annotations

import keras

L = keras.layers


# -- classic CNN -------------------------------------------------------------------------

def lenet() -> keras.Model:
    return keras.Sequential([
        keras.Input((28, 28, 1)), L.Conv2D(6, 5, padding="same", activation="tanh"),
        L.AveragePooling2D(2), L.Conv2D(16, 5, activation="tanh"), L.AveragePooling2D(2),
        L.Flatten(), L.Dense(120, activation="tanh"), L.Dense(84, activation="tanh"),
        L.Dense(10)], name="lenet")


def vgg_tiny() -> keras.Model:
    layers = [keras.Input((32, 32, 3))]
    for width in (32, 64, 128):
        layers += [L.Conv2D(width, 3, padding="same", activation="relu"),
                   L.Conv2D(width, 3, padding="same", activation="relu"), L.MaxPooling2D(2)]
    layers += [L.Flatten(), L.Dense(256, activation="relu"), L.Dropout(0.5), L.Dense(10)]
    return keras.Sequential(layers, name="vgg_tiny")


def alexnet_small() -> keras.Model:
    return keras.Sequential([
        keras.Input((96, 96, 3)), L.Conv2D(48, 11, strides=4, activation="relu"),
        L.MaxPooling2D(3, 2), L.Conv2D(96, 5, padding="same", activation="relu"),
        L.MaxPooling2D(3, 2), L.Conv2D(128, 3, padding="same", activation="relu"),
        L.Conv2D(128, 3, padding="same", activation="relu"), L.MaxPooling2D(3, 2),
        L.Flatten(), L.Dense(512, activation="relu"), L.Dense(10)], name="alexnet_small")


# -- residual ------------------------------------------------------------------------------

def _basic_block(x, width: int, stride: int = 1):
    shortcut = x
    y = L.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
    y = L.ReLU()(L.BatchNormalization()(y))
    y = L.BatchNormalization()(L.Conv2D(width, 3, padding="same", use_bias=False)(y))
    if stride != 1 or shortcut.shape[-1] != width:
        shortcut = L.Conv2D(width, 1, strides=stride, use_bias=False)(shortcut)
    return L.ReLU()(L.Add()([y, shortcut]))


def resnet_cifar() -> keras.Model:
    x = inputs = keras.Input((32, 32, 3))
    x = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, padding="same", use_bias=False)(x)))
    for width, stride in ((16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)):
        x = _basic_block(x, width, stride)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x), name="resnet_cifar")


def resnet50v2_small() -> keras.Model:
    return keras.applications.ResNet50V2(weights=None, input_shape=(64, 64, 3), classes=10)


def wide_resnet() -> keras.Model:
    x = inputs = keras.Input((32, 32, 3))
    x = L.Conv2D(32, 3, padding="same")(x)
    for width, stride in ((64, 1), (128, 2)):
        x = _basic_block(x, width, stride)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x), name="wide_resnet")


# -- depthwise / separable -------------------------------------------------------------------

def separable_net() -> keras.Model:
    """An Xception-style entry flow of separable convolutions (ImageNet-like, 96x96)."""
    x = inputs = keras.Input((96, 96, 3))
    x = L.ReLU()(L.BatchNormalization()(L.Conv2D(32, 3, strides=2, padding="same")(x)))
    for width in (64, 128, 256):
        shortcut = L.Conv2D(width, 1, strides=2, padding="same")(x)
        x = L.BatchNormalization()(L.SeparableConv2D(width, 3, padding="same")(x))
        x = L.BatchNormalization()(L.SeparableConv2D(width, 3, padding="same")(L.ReLU()(x)))
        x = L.Add()([L.MaxPooling2D(3, 2, padding="same")(x), shortcut])
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10)(x), name="separable_net")


def mobilenet_v1() -> keras.Model:
    return keras.applications.MobileNet(weights=None, input_shape=(96, 96, 3), alpha=0.5,
                                        classes=10)


def mobilenet_v3_small() -> keras.Model:
    """NAS-style mobile net (hard-swish, squeeze-excite)."""
    return keras.applications.MobileNetV3Small(weights=None, input_shape=(96, 96, 3),
                                               classes=10, include_preprocessing=False)


# -- encoder-decoder -----------------------------------------------------------------------

def _unet(size: int, widths: tuple[int, ...], name: str) -> keras.Model:
    x = inputs = keras.Input((size, size, 3))
    skips = []
    for w in widths:
        x = L.Conv2D(w, 3, padding="same", activation="relu")(x)
        x = L.Conv2D(w, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = L.MaxPooling2D(2)(x)
    x = L.Conv2D(widths[-1] * 2, 3, padding="same", activation="relu")(x)
    for w, skip in zip(reversed(widths), reversed(skips), strict=True):
        x = L.UpSampling2D()(x)
        x = L.Concatenate()([x, skip])
        x = L.Conv2D(w, 3, padding="same", activation="relu")(x)
        x = L.Conv2D(w, 3, padding="same", activation="relu")(x)
    return keras.Model(inputs, L.Conv2D(1, 1)(x), name=name)


def unet_64() -> keras.Model:
    return _unet(64, (16, 32, 64), "unet_64")


def unet_96() -> keras.Model:
    """The issue's U-Net: skip concatenations at 96x96."""
    return _unet(96, (16, 32, 64), "unet_96")


def conv_autoencoder() -> keras.Model:
    """Strided encoder, Conv2DTranspose decoder, no skips."""
    x = inputs = keras.Input((64, 64, 3))
    for w in (32, 64, 128):
        x = L.Conv2D(w, 3, strides=2, padding="same", activation="relu")(x)
    for w in (64, 32, 16):
        x = L.Conv2DTranspose(w, 3, strides=2, padding="same", activation="relu")(x)
    return keras.Model(inputs, L.Conv2D(3, 3, padding="same")(x), name="conv_autoencoder")


# -- recurrent ---------------------------------------------------------------------------

def gru() -> keras.Model:
    return keras.Sequential([keras.Input((60, 32)), L.GRU(128), L.Dense(10)], name="gru")


def bigru_text() -> keras.Model:
    """The issue's bidirectional GRU text model."""
    return keras.Sequential([keras.Input((80,), dtype="int32"), L.Embedding(10000, 64),
                             L.Bidirectional(L.GRU(64, return_sequences=True)),
                             L.Bidirectional(L.GRU(64)), L.Dense(1)], name="bigru_text")


def stacked_lstm() -> keras.Model:
    return keras.Sequential([keras.Input((40, 16)), L.LSTM(96, return_sequences=True),
                             L.LSTM(96), L.Dense(4)], name="stacked_lstm")


def simple_rnn() -> keras.Model:
    return keras.Sequential([keras.Input((100, 8)), L.SimpleRNN(128), L.Dense(1)],
                            name="simple_rnn")


# -- attention ---------------------------------------------------------------------------

def _encoder_block(x, heads: int, dim: int, mlp: int):
    y = L.LayerNormalization()(x)
    y = L.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(y, y)
    x = L.Add()([x, y])
    y = L.LayerNormalization()(x)
    y = L.Dense(dim)(L.Dense(mlp, activation="gelu")(y))
    return L.Add()([x, y])


def vit_tiny() -> keras.Model:
    """A small ViT: 4x4 patches of 32x32 images, 2 blocks, GELU MLP."""
    x = inputs = keras.Input((32, 32, 3))
    x = L.Reshape((64, 128))(L.Conv2D(128, 4, strides=4)(x))
    x = x + keras.ops.zeros((1, 64, 128))
    for _ in range(2):
        x = _encoder_block(x, 4, 128, 256)
    x = L.GlobalAveragePooling1D()(L.LayerNormalization()(x))
    return keras.Model(inputs, L.Dense(10)(x), name="vit_tiny")


def text_transformer() -> keras.Model:
    tokens = keras.Input((128,), dtype="int32")
    x = L.Embedding(8000, 96)(tokens)
    for _ in range(2):
        x = _encoder_block(x, 4, 96, 384)
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, L.Dense(2)(x), name="text_transformer")


def cross_attention() -> keras.Model:
    """Queries from one sequence, keys and values from another (two inputs)."""
    q_in, kv_in = keras.Input((32, 64)), keras.Input((96, 64))
    y = L.MultiHeadAttention(num_heads=4, key_dim=16)(q_in, kv_in)
    y = L.LayerNormalization()(L.Add()([q_in, y]))
    y = L.GlobalAveragePooling1D()(L.Dense(128, activation="gelu")(y))
    return keras.Model([q_in, kv_in], L.Dense(1)(y), name="cross_attention")


# -- Conv1D / audio ----------------------------------------------------------------------

def audio_conv1d() -> keras.Model:
    """The issue's strided Conv1D + BatchNorm over 16,000-sample audio."""
    x = inputs = keras.Input((16000, 1))
    for w, k, s in ((32, 80, 4), (32, 3, 1), (64, 3, 2), (64, 3, 2), (128, 3, 2)):
        x = L.ReLU()(L.BatchNormalization()(L.Conv1D(w, k, strides=s, padding="same")(x)))
        if s > 1:
            x = L.MaxPooling1D(2)(x)
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, L.Dense(12)(x), name="audio_conv1d")


def tcn() -> keras.Model:
    """Dilated causal Conv1D residual blocks."""
    x = inputs = keras.Input((512, 16))
    x = L.Conv1D(64, 1)(x)
    for d in (1, 2, 4, 8):
        y = L.Conv1D(64, 3, padding="causal", dilation_rate=d, activation="relu")(x)
        x = L.Add()([x, L.Conv1D(64, 3, padding="causal", dilation_rate=d)(y)])
    x = L.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, L.Dense(1)(x), name="tcn")


def text_cnn() -> keras.Model:
    tokens = keras.Input((200,), dtype="int32")
    x = L.Embedding(10000, 64)(tokens)
    pools = [L.GlobalMaxPooling1D()(L.Conv1D(64, k, activation="relu")(x)) for k in (3, 4, 5)]
    return keras.Model(tokens, L.Dense(1)(L.Concatenate()(pools)), name="text_cnn")


# -- wide MLP ----------------------------------------------------------------------------

def mlp_8192() -> keras.Model:
    """The issue's wide MLP whose step peaks in Adam's update (about 42M parameters)."""
    return keras.Sequential([keras.Input((1024,)), L.Dense(8192, activation="relu"),
                             L.Dense(4096, activation="relu"), L.Dense(10)], name="mlp_8192")


def mlp_deep() -> keras.Model:
    layers = [keras.Input((256,))]
    layers += [L.Dense(1024, activation="relu") for _ in range(6)]
    return keras.Sequential([*layers, L.Dense(10)], name="mlp_deep")


def mlp_bottleneck() -> keras.Model:
    return keras.Sequential([keras.Input((4096,)), L.Dense(256, activation="relu"),
                             L.Dense(4096, activation="relu"), L.Dense(4096)],
                            name="mlp_bottleneck")


# -- embedding-heavy / recommender -------------------------------------------------------

def two_tower() -> keras.Model:
    user, item = keras.Input((1,), dtype="int32"), keras.Input((1,), dtype="int32")
    u = L.Flatten()(L.Embedding(50000, 64)(user))
    i = L.Flatten()(L.Embedding(50000, 64)(item))
    x = L.Dense(64, activation="relu")(L.Concatenate()([u, i]))
    return keras.Model([user, item], L.Dense(1)(x), name="two_tower")


def wide_and_deep() -> keras.Model:
    sparse, dense = keras.Input((20,), dtype="int32"), keras.Input((13,))
    e = L.Flatten()(L.Embedding(100000, 16)(sparse))
    deep = L.Dense(256, activation="relu")(L.Concatenate()([e, dense]))
    deep = L.Dense(128, activation="relu")(deep)
    return keras.Model([sparse, dense], L.Dense(1)(L.Concatenate()([deep, dense])),
                       name="wide_and_deep")


def bag_of_words() -> keras.Model:
    return keras.Sequential([keras.Input((300,), dtype="int32"), L.Embedding(60000, 128),
                             L.GlobalAveragePooling1D(), L.Dense(1)], name="bag_of_words")


# -- multi-input -------------------------------------------------------------------------

def two_input() -> keras.Model:
    """The issue's two-input model: a dense branch and a small conv tower."""
    table, image = keras.Input((64,)), keras.Input((48, 48, 3))
    a = L.Dense(256, activation="relu")(table)
    b = L.Conv2D(32, 3, activation="relu")(image)
    b = L.Conv2D(64, 3, strides=2, activation="relu")(b)
    b = L.GlobalAveragePooling2D()(b)
    x = L.Dense(128, activation="relu")(L.Concatenate()([a, b]))
    return keras.Model([table, image], L.Dense(1)(x), name="two_input")


def three_input() -> keras.Model:
    text, numbers, image = (keras.Input((50,), dtype="int32"), keras.Input((16,)),
                            keras.Input((32, 32, 3)))
    t = L.GlobalAveragePooling1D()(L.Embedding(5000, 32)(text))
    n = L.Dense(32, activation="relu")(numbers)
    i = L.GlobalAveragePooling2D()(L.Conv2D(32, 3, activation="relu")(image))
    return keras.Model([text, numbers, image], L.Dense(1)(L.Concatenate()([t, n, i])),
                       name="three_input")


def siamese() -> keras.Model:
    """One shared conv tower applied to two images."""
    tower = keras.Sequential([keras.Input((32, 32, 3)),
                              L.Conv2D(32, 3, activation="relu"), L.MaxPooling2D(2),
                              L.Conv2D(64, 3, activation="relu"), L.GlobalAveragePooling2D()],
                             name="tower")
    a, b = keras.Input((32, 32, 3)), keras.Input((32, 32, 3))
    d = L.Subtract()([tower(a), tower(b)])
    return keras.Model([a, b], L.Dense(1)(d), name="siamese")


# -- subclassed --------------------------------------------------------------------------

class ResidualMLP(keras.Model):
    """Subclassed: residual dense blocks with layer norm."""

    def __init__(self) -> None:
        super().__init__(name="residual_mlp")
        self.inp = L.Dense(512)
        self.blocks = [(L.Dense(512, activation="relu"), L.LayerNormalization())
                       for _ in range(3)]
        self.out = L.Dense(10)

    def call(self, x: object) -> object:
        x = self.inp(x)
        for dense, norm in self.blocks:
            x = norm(x + dense(x))
        return self.out(x)


class SmallConvNet(keras.Model):
    """Subclassed: conv, BN, pooling, dropout, in ``call``."""

    def __init__(self) -> None:
        super().__init__(name="sub_convnet")
        self.c1, self.b1 = L.Conv2D(32, 3, padding="same"), L.BatchNormalization()
        self.c2, self.b2 = L.Conv2D(64, 3, padding="same"), L.BatchNormalization()
        self.pool, self.drop = L.MaxPooling2D(2), L.Dropout(0.25)
        self.head = L.Dense(10)

    def call(self, x: object, training: bool = False) -> object:
        x = self.pool(keras.ops.relu(self.b1(self.c1(x), training=training)))
        x = self.pool(keras.ops.relu(self.b2(self.c2(x), training=training)))
        x = keras.ops.mean(self.drop(x, training=training), axis=(1, 2))
        return self.head(x)


class GatedRNN(keras.Model):
    """Subclassed: a GRU and a gate over its sequence output."""

    def __init__(self) -> None:
        super().__init__(name="gated_rnn")
        self.rnn = L.GRU(64, return_sequences=True)
        self.gate = L.Dense(64, activation="sigmoid")
        self.out = L.Dense(1)

    def call(self, x: object) -> object:
        h = self.rnn(x)
        return self.out(keras.ops.mean(h * self.gate(h), axis=1))


def residual_mlp() -> keras.Model:
    return ResidualMLP()


def sub_convnet() -> keras.Model:
    return SmallConvNet()


def gated_rnn() -> keras.Model:
    return GatedRNN()


#: family -> cases: (name, three batch sizes, input shape or None).
FAMILIES: dict[str, list[tuple[str, tuple[int, ...], tuple[int, ...] | None]]] = {
    "classic_cnn": [("lenet", (32, 256, 1024), None), ("vgg_tiny", (16, 64, 256), None),
                    ("alexnet_small", (16, 64, 128), None)],
    "residual": [("resnet_cifar", (16, 64, 256), None),
                 ("resnet50v2_small", (8, 32, 64), None),
                 ("wide_resnet", (16, 64, 128), None)],
    "depthwise": [("separable_net", (8, 32, 64), None), ("mobilenet_v1", (16, 64, 128), None),
                  ("mobilenet_v3_small", (16, 64, 128), None)],
    "encoder_decoder": [("unet_64", (8, 32, 64), None), ("unet_96", (8, 16, 32), None),
                        ("conv_autoencoder", (16, 64, 128), None)],
    "recurrent": [("gru", (32, 128, 512), None), ("bigru_text", (16, 64, 256), None),
                  ("stacked_lstm", (32, 128, 512), None), ("simple_rnn", (32, 128, 512), None)],
    "attention": [("vit_tiny", (16, 64, 128), None), ("text_transformer", (8, 32, 128), None),
                  ("cross_attention", (32, 128, 512), None)],
    "conv1d_audio": [("audio_conv1d", (8, 32, 64), None), ("tcn", (16, 64, 256), None),
                     ("text_cnn", (32, 128, 512), None)],
    "wide_mlp": [("mlp_8192", (32, 128, 512), None), ("mlp_deep", (64, 512, 2048), None),
                 ("mlp_bottleneck", (32, 256, 1024), None)],
    "embedding": [("two_tower", (64, 512, 4096), None), ("wide_and_deep", (64, 512, 4096), None),
                  ("bag_of_words", (32, 256, 1024), None)],
    "multi_input": [("two_input", (16, 64, 256), None), ("three_input", (32, 128, 512), None),
                    ("siamese", (32, 128, 512), None)],
    "subclassed": [("residual_mlp", (64, 512, 2048), (256,)),
                   ("sub_convnet", (16, 64, 256), (32, 32, 3)),
                   ("gated_rnn", (32, 128, 512), (40, 16))],
}

#: Families with a model in the 60-case panel the estimator's constants were fitted on
#: (benchmarks/estimate_accuracy.py: small_cnn, resnet50, mobilenet_v2 + efficientnet_b0,
#: lstm, transformer_block, mlp + mlp_bn_dropout, embedding_bag, subclassed). The other
#: families (encoder_decoder, conv1d_audio, multi_input) are out of family for them.
IN_OLD_PANEL: frozenset[str] = frozenset({
    "classic_cnn", "residual", "depthwise", "recurrent", "attention", "wide_mlp",
    "embedding", "subclassed"})

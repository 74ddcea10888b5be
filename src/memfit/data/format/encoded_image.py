"""How a feature of encoded image files is decoded in the stream: the manifest's
``decode`` object of a ``pack(images=..., keep_encoded=True)`` dataset.

Example:
    >>> EncodedImage(128, 96, False, (256, 256)).decoded_bytes
    36864
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["EncodedImage"]


@dataclasses.dataclass(frozen=True)
class EncodedImage:
    """How a feature of encoded image files (``pack(images=..., keep_encoded=True)``) is
    decoded in the stream: ``tf.io.decode_image(channels=3, expand_animations=False)``,
    Keras's centred crop when ``crop_to_aspect_ratio``, ``tf.image.resize`` bilinear to
    ``(height, width)``, rounded to uint8. ``largest`` is the ``(height, width)`` of the
    packed image with the most pixels (what one decode holds, for the byte budget).

    Example:
        >>> e = EncodedImage(128, 96, False, (256, 256))
        >>> EncodedImage.from_json(e.to_json()) == e, e.decoded_bytes
        (True, 36864)
    """

    height: int
    width: int
    crop_to_aspect_ratio: bool
    largest: tuple[int, int]

    @property
    def decoded_bytes(self) -> int:
        """Bytes of one decoded, resized image (uint8, height × width × 3)."""
        return self.height * self.width * 3

    @property
    def work_bytes(self) -> int:
        """Bytes one decode holds at its peak: the largest image decoded (and cropped),
        the float32 resize and the uint8 result."""
        return 2 * self.largest[0] * self.largest[1] * 3 + 5 * self.decoded_bytes

    def to_json(self) -> dict[str, Any]:
        return {"kind": "image", "size": [self.height, self.width], "channels": 3,
                "interpolation": "bilinear", "crop_to_aspect_ratio": self.crop_to_aspect_ratio,
                "largest": list(self.largest), "dtype": "uint8"}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EncodedImage:
        (h, w), (lh, lw) = doc["size"], doc["largest"]
        return cls(int(h), int(w), bool(doc["crop_to_aspect_ratio"]), (int(lh), int(lw)))

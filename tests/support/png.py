"""Reading a PNG (what headless Chromium writes) with the standard library only, to check a screenshot is
not blank: its size and the colour of every pixel.

Only what Chromium produces is supported: 8-bit RGB or RGBA, not interlaced.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter

__all__ = ["Image", "read_png"]


class Image:
    """A decoded image: ``width``, ``height`` and ``pixels`` (row-major ``(r, g, b)`` tuples)."""

    def __init__(self, width: int, height: int, pixels: list[tuple[int, int, int]]) -> None:
        self.width = width
        self.height = height
        self.pixels = pixels

    def colours(self) -> Counter[tuple[int, int, int]]:
        """How many pixels have each colour."""
        return Counter(self.pixels)

    def share(self, predicate) -> float:
        """The share (0..1) of pixels for which ``predicate((r, g, b))`` is true."""
        return sum(1 for p in self.pixels if predicate(p)) / max(1, len(self.pixels))

    def has_colour(self, hex_colour: str, tolerance: int = 12, at_least: int = 20) -> bool:
        """At least ``at_least`` pixels within ``tolerance`` (per channel) of ``#rrggbb``."""
        target = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        count = 0
        for colour, n in self.colours().items():
            if all(abs(a - b) <= tolerance for a, b in zip(colour, target)):
                count += n
        return count >= at_least


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read_png(data: bytes) -> Image:
    """Decode ``data``.

    Raises:
        ValueError: not a PNG, or a kind this reader does not support.
    """
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("no IHDR")
    width, height, depth, colour_type, _compression, _filter, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour_type}, interlace {interlace}")
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    pixels: list[tuple[int, int, int]] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            upper_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + _paeth(left, up, upper_left)) & 0xFF
        pixels.extend((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels))
        previous = line
    return Image(width, height, pixels)

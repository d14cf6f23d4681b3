"""Layout sketches of the dashboards as PNG: panel titles in their grid positions (pure Python, no Pillow).

A tiny 3x5 bitmap font (upper case, digits, some punctuation) and a zlib PNG writer are enough for a
deterministic picture of each dashboard's layout (``docs/dashboards/<uid>.png``).
"""

from __future__ import annotations

import struct
import zlib

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile
from inferwatch.dashboards import panels as M
from inferwatch.dashboards.registry import dashboards

CELL_W = 40
"""pixels per grid column (24 columns)."""
CELL_H = 22
"""pixels per grid row unit."""
MARGIN = 8
HEADER = 34
SCALE = 2
CHAR_W = 4 * SCALE
LINE_H = 7 * SCALE

RGB = tuple[int, int, int]
BACKGROUND: RGB = (24, 27, 31)
BORDER: RGB = (110, 118, 129)
TEXT: RGB = (230, 232, 235)
FILL: dict[str, RGB] = {
    M.TIMESERIES: (36, 52, 75),
    M.STAT: (40, 70, 52),
    M.TABLE: (70, 58, 36),
    M.HEATMAP: (78, 42, 36),
    M.TEXT: (55, 55, 60),
    "row": (48, 48, 56),
}

_GLYPHS = {
    "A": "010101111101101",
    "B": "110101110101110",
    "C": "011100100100011",
    "D": "110101101101110",
    "E": "111100110100111",
    "F": "111100110100100",
    "G": "011100101101011",
    "H": "101101111101101",
    "I": "111010010010111",
    "J": "001001001101010",
    "K": "101101110101101",
    "L": "100100100100111",
    "M": "101111111101101",
    "N": "110101101101101",
    "O": "010101101101010",
    "P": "110101110100100",
    "Q": "010101101110011",
    "R": "110101110101101",
    "S": "011100010001110",
    "T": "111010010010010",
    "U": "101101101101111",
    "V": "101101101101010",
    "W": "101101111111101",
    "X": "101101010101101",
    "Y": "101101010010010",
    "Z": "111001010100111",
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "110001010100111",
    "3": "110001010001110",
    "4": "101101111001001",
    "5": "111100110001110",
    "6": "011100111101111",
    "7": "111001010010010",
    "8": "111101111101111",
    "9": "111101111001110",
    " ": "000000000000000",
    "/": "001001010100100",
    "-": "000000111000000",
    ":": "000010000010000",
    ".": "000000000000010",
    ",": "000000000010100",
    "&": "010101010101011",
    "(": "001010010010001",
    ")": "100010010010100",
    "%": "101001010100101",
    "_": "000000000000111",
    "?": "110001010000010",
}


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(BACKGROUND) * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: RGB) -> None:
        x0, x1 = max(0, x0), min(self.width, x1)
        line = bytes(color) * max(0, x1 - x0)
        for y in range(max(0, y0), min(self.height, y1)):
            start = (y * self.width + x0) * 3
            self.pixels[start : start + len(line)] = line

    def box(self, x0: int, y0: int, x1: int, y1: int, fill: RGB) -> None:
        self.rect(x0, y0, x1, y1, BORDER)
        self.rect(x0 + 1, y0 + 1, x1 - 1, y1 - 1, fill)

    def text(self, x: int, y: int, text: str, color: RGB = TEXT) -> None:
        for i, ch in enumerate(text.upper()):
            glyph = _GLYPHS.get(ch, _GLYPHS["?"])
            for bit, on in enumerate(glyph):
                if on == "1":
                    gx, gy = x + i * CHAR_W + (bit % 3) * SCALE, y + (bit // 3) * SCALE
                    self.rect(gx, gy, gx + SCALE, gy + SCALE, color)

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap to ``width`` characters (long words are cut)."""
    lines: list[str] = []
    current = ""
    for word in text.replace("×", "x").split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        candidate = f"{current} {word}".strip()
        if len(candidate) <= width:
            current = candidate
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def _label(item: M.Panel | M.Row) -> str:
    return item.title if isinstance(item, M.Row) else f"{item.title} ({item.kind})"


def sketch_png(spec: M.DashboardSpec) -> bytes:
    """A PNG of the dashboard's grid: one box per panel or row, with its title."""
    placed = M.layout(spec.panels)
    rows = max((p.y + p.h for p in placed), default=0)
    width = M.GRID_WIDTH * CELL_W + 2 * MARGIN
    height = HEADER + rows * CELL_H + 2 * MARGIN
    canvas = Canvas(width, height)
    canvas.text(MARGIN, MARGIN, f"{spec.title}  ({spec.uid})")
    for p in placed:
        x0 = MARGIN + p.x * CELL_W
        y0 = HEADER + MARGIN + p.y * CELL_H
        x1, y1 = x0 + p.w * CELL_W - 2, y0 + p.h * CELL_H - 2
        canvas.box(x0, y0, x1, y1, FILL.get(p.item.kind, FILL[M.TIMESERIES]))
        max_lines = max(1, (y1 - y0 - 6) // LINE_H)
        lines = wrap(_label(p.item), max(1, (x1 - x0 - 8) // CHAR_W))[:max_lines]
        for i, line in enumerate(lines):
            canvas.text(x0 + 5, y0 + 4 + i * LINE_H, line)
    return canvas.png()


def sketches(spec: SLOFile | None, vocabulary: V.Vocabulary) -> dict[str, bytes]:
    """``{"<uid>.png": png bytes}`` for every dashboard (written to ``docs/dashboards/``)."""
    return {f"{d.uid}.png": sketch_png(d) for d in dashboards(spec, vocabulary)}

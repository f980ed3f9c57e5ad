"""The dashboard's favicon, drawn here and served by Streamlit itself.

A ``:material/...`` or emoji page icon is fetched by the browser from a font CDN
(fonts.gstatic.com for material icons), which fails offline and on a cluster without
internet; an image array is served from the dashboard's own media endpoint.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

SIZE = 32
BACKGROUND = (31, 119, 180)  # the dashboard's first colour
GAUGE = (255, 255, 255)


def page_icon() -> bytes:
    """The icon as PNG bytes (Streamlit compares a page icon with a string, which an
    array cannot be)."""
    out = io.BytesIO()
    Image.fromarray(icon_pixels()).save(out, format="PNG")
    return out.getvalue()


def icon_pixels() -> np.ndarray:
    """A 32x32 RGB gauge: a white ring with a needle on blue (a stopwatch's face)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(float) - (SIZE - 1) / 2.0
    r = np.hypot(x, y)
    img = np.empty((SIZE, SIZE, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    ring = (r > SIZE * 0.30) & (r < SIZE * 0.40)
    # the needle: points on the segment from the centre towards the upper right
    along = (x - y) / np.sqrt(2.0)
    across = np.abs(x + y) / np.sqrt(2.0)
    needle = (along > 0) & (along < SIZE * 0.30) & (across < 1.5)
    img[ring | needle] = GAUGE
    return img


__all__ = ["icon_pixels", "page_icon"]

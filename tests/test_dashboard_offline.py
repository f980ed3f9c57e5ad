"""The dashboard works offline: nothing it serves is fetched from a CDN (issue 39)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

from stepscope.app.dashboard.page_icon import icon_pixels, page_icon

DASHBOARD = Path(__file__).resolve().parents[1] / "stepscope" / "app" / "dashboard"
# hosts a browser would fetch fonts or icons from
CDN = re.compile(r"https?://[^\s\"')]*(fonts\.|gstatic|cdn|jsdelivr|unpkg|twemoji|favicon)", re.I)


def test_no_font_or_favicon_is_fetched_from_a_cdn() -> None:
    hits = [
        f"{path.relative_to(DASHBOARD)}: {m.group(0)}"
        for path in DASHBOARD.rglob("*")
        if path.suffix in {".py", ".css", ".html", ".toml", ".js"}
        for m in CDN.finditer(path.read_text(encoding="utf-8"))
    ]
    assert hits == []


def test_the_page_icon_is_an_image_served_by_the_dashboard() -> None:
    # a ":material/..." icon was fetched from fonts.gstatic.com by the browser; an emoji
    # from an emoji CDN: both fail offline. An image is served from Streamlit's media.
    tree = ast.parse((DASHBOARD / "main.py").read_text(encoding="utf-8"))
    icons = [
        kw.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "set_page_config"
        for kw in node.keywords
        if kw.arg == "page_icon"
    ]
    assert len(icons) == 1 and not isinstance(icons[0], ast.Constant)
    assert page_icon().startswith(b"\x89PNG")
    img = icon_pixels()
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    assert len(np.unique(img.reshape(-1, 3), axis=0)) == 2  # a drawing, not a blank square

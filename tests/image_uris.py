"""Reading back the frames the world sends as data URIs (the inverse of ``envs.render.png_data_uri``).

Only tests need it: the library writes data URIs (skyrl-gym observations) and never reads them.
"""

from __future__ import annotations

import base64
import io

from PIL import Image


def image_from_data_uri(uri: str) -> Image.Image:
    """Inverse of :func:`envs.render.png_data_uri` (any base64 image data URI)."""
    header, _, payload = uri.partition(",")
    if not header.startswith("data:image/") or ";base64" not in header:
        raise ValueError(f"expected a base64 image data URI, got one starting with {uri[:40]!r}")
    return Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB")

"""GET /admin/dashboard: one self-contained page (dashboard.html) that polls the admin API.

The page holds no data and no secret: everything it shows comes from the JSON routes, with
the admin key the operator types in. A browser's navigation cannot send that key, so with
admin keys configured the page itself opens without one; without admin keys it answers
loopback clients only, as every admin route does.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from starlette.responses import Response

_PAGE = resources.files("gateway.admin").joinpath("dashboard.html").read_text("utf-8")
# Whether the page must ask for a key: set per answer (a reload may add or drop admin keys).
_AUTH_MARK = 'data-auth="none"'


def _inline_hashes(tag: str) -> list[str]:
    """CSP sources of the page's inline <tag> blocks: only these may run (injected ones not)."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", _PAGE, flags=re.DOTALL)
    digests = (hashlib.sha256(b.encode()).digest() for b in blocks)
    return [f"'sha256-{base64.b64encode(d).decode()}'" for d in digests]


# Defence in depth behind the page's escaping: no other script, style, frame or form target.
_CSP = "; ".join(
    (
        "default-src 'none'",
        f"script-src {' '.join(_inline_hashes('script'))}",
        f"style-src {' '.join(_inline_hashes('style'))}",
        "connect-src 'self'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
_HEADERS = {
    "content-security-policy": _CSP,
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def dashboard_page(keys_enabled: bool) -> str:
    """The page's HTML; `keys_enabled`: it asks for the admin key before its first poll."""
    assert _AUTH_MARK in _PAGE, "dashboard.html lost its data-auth attribute"
    return _PAGE.replace(_AUTH_MARK, 'data-auth="key"') if keys_enabled else _PAGE


def dashboard_response(keys_enabled: bool) -> Response:
    """The page with its headers (the caller has checked who may see it)."""
    return Response(
        dashboard_page(keys_enabled), media_type="text/html; charset=utf-8", headers=_HEADERS
    )

"""One self-contained HTML page for a rollout: inline CSS and JS, the result embedded once as JSON, no network."""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from importlib import resources

from opencode_env.wire.models import RolloutResult

# Inside <script type="application/json"> the HTML parser only stops at "</script" (or changes state at "<!--"),
# so escaping every "<" (and ">", "&" for good measure) as a JSON \u escape makes hostile text inert; U+2028/9
# are escaped so the block stays valid even if someone evaluates it as JavaScript.
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPE_TABLE = str.maketrans(_JSON_ESCAPES)


@cache
def asset(name: str) -> str:
    return resources.files("opencode_env.viewer").joinpath("assets", name).read_text(encoding="utf-8")


def csp_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def embed_json(json_text: str) -> str:
    """JSON text made safe to sit inside a <script type="application/json"> element."""
    return json_text.translate(_ESCAPE_TABLE)


def content_security_policy(scripts: list[str], styles: list[str], connect: str = "'none'") -> str:
    """Only our own inline script and style run; no fetch, image, font or frame can reach the network."""
    return (
        "default-src 'none'; "
        f"script-src {' '.join(csp_hash(s) for s in scripts)}; "
        f"style-src {' '.join(csp_hash(s) for s in styles)}; "
        f"img-src data:; connect-src {connect}; base-uri 'none'; form-action 'none'"
    )


def html_document(title: str, body: str, scripts: list[str], styles: list[str], connect: str = "'none'") -> str:
    csp = content_security_policy(scripts, styles, connect)
    style_tags = "".join(f"<style>{style}</style>" for style in styles)
    script_tags = "".join(f"<script>{script}</script>" for script in scripts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{title}</title>{style_tags}</head><body>{body}{script_tags}</body></html>\n"
    )


def render_page(result: RolloutResult) -> str:
    """The viewer page for one result; opens offline in any browser."""
    data = embed_json(result.model_dump_json())
    body = f'<div id="app"></div><script type="application/json" id="rollout-data">{data}</script>'
    return html_document("opencode-env rollout", body, [asset("viewer.js")], [asset("viewer.css")])

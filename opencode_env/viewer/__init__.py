"""The rollout viewer: a self-contained HTML page (`render_page`), also served by the server at /web."""

from opencode_env.viewer.page import render_page

__all__ = ["render_page"]

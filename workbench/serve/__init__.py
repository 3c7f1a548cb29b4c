"""An OpenAI-compatible HTTP server over the continuous-batching scheduler (``workbench serve``)."""

from .app import create_app

__all__ = ["create_app"]

"""HTTP serving: the FastAPI app, dynamic batching, metrics and the attention page."""

from aiayn.serving.app import ServeSettings, create_app

__all__ = ["ServeSettings", "create_app"]

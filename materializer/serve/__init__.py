"""The query server (issue 39): read-only HTTP access to the topics a run materializes.

``materializer run ... --serve HOST:PORT`` starts it in the run's process; in Python,
:func:`create_app` is an ASGI app (Starlette) over :class:`TopicSource` s that can be mounted in a
Starlette or FastAPI app, and :class:`QueryServer` serves one on uvicorn from a background
thread. Needs ``pip install 'kafka-materializer[serve]'``. docs/serving.md says what it answers.
"""

from materializer.serve.app import create_app
from materializer.serve.server import QueryServer
from materializer.serve.sources import NotServing, TopicSource, source_of, view_source

__all__ = ["NotServing", "QueryServer", "TopicSource", "create_app", "source_of", "view_source"]

"""A small HTTP service that serves the latest Avro value of each key of a compacted topic.

Run:  python examples/service/http_service.py --bootstrap-servers HOST:PORT --schema-registry-url URL \
          [--topic profiles] [--data-dir DIR] [--port 8000]

Needs the ``avro`` extra and Starlette + uvicorn (``pip install 'kafka-materializer[avro]' starlette
uvicorn``). At start-up the service restores from its data directory and fetches only the tail
the broker has beyond it; it answers ``503`` until it has caught up, and again if ingest fails (it
never serves stale data silently). SIGTERM / Ctrl-C stop it cleanly.

Endpoints::

    GET /health               {"running", "caught_up", "failed", "offsets"}; 200 when ready, else 503
    GET /profiles/{key}       the decoded Avro value as JSON, with partition/offset/timestamp; 404 absent
    GET /profiles?prefix=P    up to ``limit`` (100) keys starting with P, in key order
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path
from typing import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from materializer import Materializer, MaterializerOptions
from materializer.adapters.serdes import to_json_compatible


def build_app(bootstrap_servers: str, topic: str, data_dir: Path, schema_registry_url: str) -> Starlette:
    """The Starlette app: a Materializer ingesting ``topic`` in a background thread, read through its view."""
    # broker_timeout_ms: requests unanswered this long (or at once: every bootstrap server refuses a
    # connection) and the cluster counts as away: caught_up false (503 here), retried with backoff
    options = MaterializerOptions(key_format="str", value_format="avro", schema_registry_url=schema_registry_url,
                                  on_bad_record="skip", progress=False, broker_timeout_ms=30_000)
    materializer = Materializer(bootstrap_servers, topic, data_dir, options=options)

    def unavailable() -> JSONResponse | None:
        health = materializer.health
        if health.failed is not None:
            return JSONResponse({"error": f"ingest failed: {health.failed}"}, status_code=503)
        if not health.caught_up:
            return JSONResponse({"error": "still catching up with the topic"}, status_code=503)
        return None

    async def health(request: Request) -> JSONResponse:
        state = materializer.health
        body = {"running": state.running, "caught_up": state.caught_up,
                "failed": None if state.failed is None else str(state.failed),
                "offsets": materializer.store.offsets() if materializer.store else {}}
        return JSONResponse(body, status_code=503 if unavailable() else 200)

    async def get_profile(request: Request) -> JSONResponse:
        if (refusal := unavailable()) is not None:
            return refusal
        entry = materializer.view().get_entry(request.path_params["key"])
        if entry is None:
            return JSONResponse({"error": "no such key"}, status_code=404)
        return JSONResponse({"key": entry.key, "value": to_json_compatible(entry.value),
                             "partition": entry.partition, "offset": entry.offset, "timestamp": entry.timestamp})

    async def list_profiles(request: Request) -> JSONResponse:
        if (refusal := unavailable()) is not None:
            return refusal
        prefix = request.query_params.get("prefix", "")
        limit = int(request.query_params.get("limit", "100"))
        entries = []
        for entry in materializer.view().scan(prefix=prefix):
            if len(entries) == limit:
                break
            entries.append({"key": entry.key, "value": to_json_compatible(entry.value)})
        return JSONResponse(entries)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        materializer.run_in_background()
        try:
            yield
        finally:
            materializer.stop()
            materializer.close()

    return Starlette(routes=[Route("/health", health), Route("/profiles/{key}", get_profile),
                             Route("/profiles", list_profiles)], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--schema-registry-url", required=True)
    parser.add_argument("--topic", default="profiles")
    parser.add_argument("--data-dir", type=Path, default=Path("profiles-data"))
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(args.bootstrap_servers, args.topic, args.data_dir, args.schema_registry_url)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="info")


if __name__ == "__main__":
    main()

"""A FastAPI app for tests/test_opentelemetry.py, run by a real uvicorn: ``GET /enqueue?n=N``
pushes ``OtelOk`` through the asyncio client made at startup. The request's SERVER span is
FastAPI's own (its built-in telemetry traces requests once a tracer provider is set)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from otel_app import OtelOk  # run with tests/ on sys.path, as the daemon imports otel_app

import forkq.opentelemetry
from forkq import aio

forkq.opentelemetry.instrument()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    client = aio.Client()  # FORKQ_REDIS_URL
    aio.configure(client)
    try:
        yield
    finally:
        aio.configure(None)
        await client.aclose()


app = FastAPI(lifespan=lifespan)


@app.get("/enqueue")
async def enqueue(n: int) -> dict[str, str | None]:
    return {"jid": await OtelOk.perform_async_aio(n)}

"""A real HTTP tool server on loopback (seed 000's ``handler_type: http``), for the tool
tests: it answers ``{status, result}`` and keeps every request it got.

    with HttpToolServer() as tools:
        tools.url("/weather")      # POST {call_id, name, arguments, conversation, user}

Routes: ``/weather`` (success, the city's weather), ``/fail`` (status error),
``/notjson`` (a plain-text answer), ``/500`` (HTTP 500), ``/slow`` (sleeps
``arguments.seconds``; ``max_in_flight`` counts how many ran at once).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


class HttpToolServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        app = FastAPI()

        @app.post("/weather")
        async def weather(request: Request) -> Any:
            body = await self._record(request)
            city = (body.get("arguments") or {}).get("city", "?")
            return {"status": "success", "result": {"city": city, "sky": "clear", "celsius": 21}}

        @app.post("/fail")
        async def fail(request: Request) -> Any:
            await self._record(request)
            return {"status": "error", "result": "no such city"}

        @app.post("/notjson")
        async def notjson(request: Request) -> Any:
            await self._record(request)
            return PlainTextResponse("sunny, probably")

        @app.post("/500")
        async def error(request: Request) -> Any:
            await self._record(request)
            return JSONResponse({"detail": "boom"}, status_code=500)

        @app.post("/slow")
        async def slow(request: Request) -> Any:
            body = await self._record(request)
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(float((body.get("arguments") or {}).get("seconds", 0.5)))
            finally:
                with self._lock:
                    self.in_flight -= 1
            return {"status": "success", "result": "rested"}

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="http-tools", daemon=True)

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
        return body

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> HttpToolServer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the HTTP tool server did not start")
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

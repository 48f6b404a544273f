"""OpenTelemetry traces of turns (SPEC §16): optional, off unless ``[otel] endpoint``.

Each turn is a trace: a span for the turn, one per model call (``chat <model>``, with
the GenAI semantic-convention attributes) and one per tool call (``execute_tool
<name>``). Message content is recorded only with ``capture_content = true``.

The ``opentelemetry`` packages are the optional extra ``turnd[otel]`` and are imported
only when an endpoint is configured. Spans are handed to the SDK's batch processor,
which exports them from its own thread: a turn only appends to its queue, so an
endpoint that is slow or gone never slows a turn (a full queue drops spans). Export
failures are logged by turnd at most once a minute; the exporter's own per-batch
messages are silenced.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("turnd.otel")

LOG_EVERY_SECONDS = 60.0
EXPORT_TIMEOUT_SECONDS = 5.0
MAX_CONTENT = 65_536  # characters of captured content per attribute


@dataclass(frozen=True, slots=True)
class OtelSettings:
    endpoint: str | None = None
    capture_content: bool = False
    service_name: str = "turnd"
    # How long spans wait to be batched; tests shorten it instead of sleeping.
    batch_delay_ms: int = 2000


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP base URL (``http://host:4318``) or the full traces URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


# -- the no-op side (no opentelemetry import) ----------------------------------------------


class _NoSpan:
    def end(self, *args: Any, **kwargs: Any) -> None:
        pass


NO_SPAN = _NoSpan()


class TurnTrace:
    """The spans of one turn; this base records nothing."""

    def step_span(self, index: int, ref: Mapping[str, str], body: Mapping[str, Any]) -> Any:
        return NO_SPAN

    def tool_span(self, name: str, call_id: str, arguments: str) -> Any:
        return NO_SPAN

    def end(self, record: Mapping[str, Any], cost: float | None) -> None:
        pass


NO_TRACE = TurnTrace()


class Telemetry:
    """Traces off: every turn gets :data:`NO_TRACE`."""

    enabled = False

    def turn(self, skey: str, reply_key: str, model: Mapping[str, str]) -> TurnTrace:
        return NO_TRACE

    def shutdown(self) -> None:
        pass


def open_telemetry(settings: OtelSettings | None) -> Telemetry:
    if settings is None or not settings.endpoint:
        return Telemetry()
    return _Otel(settings)


# -- OpenTelemetry -------------------------------------------------------------------------


def _content(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_CONTENT else text[:MAX_CONTENT] + "…"


class _Otel(Telemetry):
    enabled = True

    def __init__(self, settings: OtelSettings) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise RuntimeError(
                "otel.endpoint: the OpenTelemetry packages are not installed "
                "(pip install 'turnd[otel]')"
            ) from exc
        assert settings.endpoint
        self.settings = settings
        self.url = traces_url(settings.endpoint)
        # turnd reports export failures itself, once a minute (see _QuietExporter).
        logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)
        exporter = _quiet_exporter(OTLPSpanExporter(endpoint=self.url, timeout=EXPORT_TIMEOUT_SECONDS), self.url)
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name})
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                schedule_delay_millis=settings.batch_delay_ms,
                export_timeout_millis=EXPORT_TIMEOUT_SECONDS * 1000,
            )
        )
        self._tracer = self._provider.get_tracer("turnd")

    def turn(self, skey: str, reply_key: str, model: Mapping[str, str]) -> TurnTrace:
        return _OtelTurn(self._tracer, self.settings.capture_content, skey, reply_key, model)

    def shutdown(self) -> None:
        """Flush what is queued (bounded by the export timeout) and stop the exporter."""
        self._provider.shutdown()


def _quiet_exporter(inner: Any, url: str) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class _QuietExporter(SpanExporter):
        """The OTLP exporter, with its failures logged at most once a minute."""

        def __init__(self) -> None:
            self._last_logged = -LOG_EVERY_SECONDS
            self._failures = 0
            self._lock = threading.Lock()

        def export(self, spans: Sequence[Any]) -> Any:
            try:
                result = inner.export(spans)
                error = None if result == SpanExportResult.SUCCESS else "the endpoint did not accept them"
            except Exception as exc:  # noqa: BLE001 - an exporter fault must not reach the SDK thread
                result, error = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
            if error is not None:
                self._failed(len(spans), error)
            return result

        def _failed(self, count: int, error: str) -> None:
            with self._lock:
                self._failures += count
                now = time.monotonic()
                if now - self._last_logged < LOG_EVERY_SECONDS:
                    return
                self._last_logged = now
                dropped, self._failures = self._failures, 0
            log.warning(
                "could not export traces to %s (%s); %d span(s) dropped; "
                "the next failure is logged in a minute at the earliest",
                url,
                error,
                dropped,
            )

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return _QuietExporter()


class _OtelSpan:
    __slots__ = ("_span", "_capture")

    def __init__(self, span: Any, capture: bool) -> None:
        self._span = span
        self._capture = capture


class _OtelStep(_OtelSpan):
    def end(self, *, model: str | None, usage: Any, error: str | None) -> None:
        span = self._span
        if model:
            span.set_attribute("gen_ai.response.model", usage.model or model)
        if usage.seen:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output)
            if usage.cached_seen:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached)
        if error is not None:
            _fail(span, error)
        span.end()


class _OtelTool(_OtelSpan):
    def end(self, output: Any, is_error: bool) -> None:
        span = self._span
        if self._capture:
            span.set_attribute("gen_ai.tool.call.result", _content(output))
        if is_error:
            _fail(span, "tool_error")
        span.end()


def _fail(span: Any, error: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", "model_error" if error != "tool_error" else error)
    span.set_status(Status(StatusCode.ERROR, error[:200]))


class _OtelTurn(TurnTrace):
    def __init__(
        self, tracer: Any, capture: bool, skey: str, reply_key: str, model: Mapping[str, str]
    ) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._capture = capture
        self._span = tracer.start_span(
            "turnd.turn",
            kind=trace.SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "turnd",
                "gen_ai.conversation.id": skey,
                "turnd.reply_key": reply_key,
                "gen_ai.request.model": model["id"],
                "gen_ai.provider.name": model["provider"],
            },
        )
        self._context = trace.set_span_in_context(self._span)

    def step_span(self, index: int, ref: Mapping[str, str], body: Mapping[str, Any]) -> Any:
        from opentelemetry import trace

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": ref["provider"],
            "gen_ai.request.model": ref["id"],
            "turnd.step": index,
        }
        if self._capture:
            attributes["gen_ai.input.messages"] = _content(body.get("messages", []))
        span = self._tracer.start_span(
            f"chat {ref['id']}", context=self._context, kind=trace.SpanKind.CLIENT,
            attributes=attributes,
        )
        return _OtelStep(span, self._capture)

    def tool_span(self, name: str, call_id: str, arguments: str) -> Any:
        from opentelemetry import trace

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
        }
        if self._capture:
            attributes["gen_ai.tool.call.arguments"] = _content(arguments)
        span = self._tracer.start_span(
            f"execute_tool {name}", context=self._context, kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
        )
        return _OtelTool(span, self._capture)

    def end(self, record: Mapping[str, Any], cost: float | None) -> None:
        span = self._span
        status = record.get("status", "")
        span.set_attribute("turnd.status", status)
        model = record.get("model") or {}
        if model.get("id"):
            span.set_attribute("gen_ai.response.model", model["id"])
        usage = record.get("usage") or {}
        if usage:
            span.set_attribute("gen_ai.usage.input_tokens", usage.get("inputTokens", 0))
            span.set_attribute("gen_ai.usage.output_tokens", usage.get("outputTokens", 0))
        if cost is not None:
            span.set_attribute("turnd.cost_usd", cost)
        if self._capture:
            parts = (record.get("content") or {}).get("parts") or []
            text = "".join(p.get("text", "") for p in parts if str(p.get("$type", "")).endswith("#textPart"))
            span.set_attribute("gen_ai.output.messages", _content([{"role": "assistant", "content": text}]))
        if status == "error":
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", "turn_error")
            # The error text of a reply is short and scrubbed of secrets already.
            span.set_status(Status(StatusCode.ERROR, str(record.get("error", ""))[:200]))
        span.end()

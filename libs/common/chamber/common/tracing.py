"""OpenTelemetry tracing: a no-op unless `CHAMBER_OTEL_EXPORTER` asks for an exporter."""

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter


class TracingError(RuntimeError):
    """The requested exporter cannot be set up."""


def setup_tracing(service: str, exporter: str) -> None:
    if not exporter:
        return
    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise TracingError("otlp tracing needs `pip install opentelemetry-exporter-otlp-proto-http`") from exc
        span_exporter = OTLPSpanExporter()
    else:
        raise TracingError(f"unknown CHAMBER_OTEL_EXPORTER {exporter!r}: use '', 'console' or 'otlp'")
    provider = TracerProvider(resource=Resource.create({"service.name": f"chamber-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)

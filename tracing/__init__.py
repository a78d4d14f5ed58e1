"""Observability: OpenTelemetry-model spans exported as OTLP, Prometheus metrics, logs."""

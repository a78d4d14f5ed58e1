"""Observability: logging set-up now; OpenTelemetry spans and Prometheus metrics join here."""

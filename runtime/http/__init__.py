"""The HTTP surface: routes, content negotiation, error responses."""

"""Serving: the HTTP app, per-function schedulers, scale to zero, and the ``fnrt`` CLI."""

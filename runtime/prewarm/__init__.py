"""Predictive pre-warming and adaptive keep-alive: histories, policies, and the trace simulator."""

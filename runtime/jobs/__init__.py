"""Asynchronous jobs: batch predictions through a queue in the store, run on idle capacity
(the board: what is stored; the runner: a node's share of the work; the records: formats)."""

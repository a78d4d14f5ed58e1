"""The ``fnrt`` command line."""

"""The ``nvtx-regions`` command line: one module per command, `main` dispatching.

The top layer: it may import every other layer, and nothing imports it.
"""

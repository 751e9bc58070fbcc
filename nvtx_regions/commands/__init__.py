"""The ``nvtx-regions`` command line: one module per command (``add_arguments``
and ``run``), one parser built by `main`, one table of exit statuses
(`status`), one ``--domain`` option (`domain`).

The top layer: it may import every other layer, and nothing imports it.
"""

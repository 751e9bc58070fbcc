"""What each op of a thunder trace is: its reads and writes (`traceview`) and
the module call it belongs to forward and backward (`module_calls`). Every
reach into thunder's and torch's internals sits in `nvtx_regions.internals`.
Imports only `core` and `internals`.
"""

"""What each op of a thunder trace is: its reads and writes (`traceview`), the
module call it belongs to forward and backward (`module_calls`), and every
reach into thunder's and torch's internals (`thunder_internals`, the one
place that does so). Imports only `core`.
"""

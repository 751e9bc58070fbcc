"""What each op of a thunder trace is: its reads and writes (`traceview`), the
module call it belongs to forward and backward (`module_calls`), and the
user's markers open around it (`marker_logs` records them while thunder
traces; `recording` turns the recording on). Every reach into thunder's and
torch's internals sits in `nvtx_regions.internals`. Imports only `core` and
`internals`.
"""

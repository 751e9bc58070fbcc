"""Recording the NVTX calls a process makes, without a GPU or Nsight.

`build` compiles the injection library (``nvtx_capture.c``), `inject` attaches
it in-process or to a child, `events` holds the recorded events and range
trees, `chrome` reads and writes Chrome Trace Event Format, `directory` turns
a capture directory (one event file per process) into a trace, `summary`
tables them. (`report.nsys_report` reads Nsight Systems reports into the same
records.) Independent of thunder and of the language; imports only `core`.
`nvtx_regions.testing` is its face for tests.
"""

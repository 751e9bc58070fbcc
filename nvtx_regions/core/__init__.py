"""The leaf layer: value types and helpers every other layer uses.

Errors and warnings (`errors`), bitsets over trace positions (`bits`), module
calls and their chains (`calls`), the user's own NVTX markers (`markers`),
glob matching (`globs`), the one text-table renderer (`table`), the names that
eager and thunder profiles must share (`naming`), and those of step ranges and
backends (`profiling`). Nothing here imports
another part of nvtx_regions, torch or thunder.
"""

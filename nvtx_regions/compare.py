"""The public path of capture comparison: ``from nvtx_regions.compare import compare``.

The code lives in `nvtx_regions.report.compare`.
"""

from .core.errors import CaptureFileError
from .report.compare import CompareRow, chrome_trace, compare, load_ranges, render_table, write_chrome_trace

__all__ = ["CaptureFileError", "CompareRow", "compare", "load_ranges", "render_table", "write_chrome_trace", "chrome_trace"]

"""Reports for people: `explain()` (`explanation`), the range tree drawing
(`rangeart`), and what a finished run's files say. One reader (`reader`)
reads Nsight Systems reports (`nsys_report`) and Chrome-trace captures
(`chrome_trace`) into `capture.chrome.RangeRecord` items; from them come
the summary per range, rule and module (`records`), two captures side by
side (`compare`), and backends side by side (`backends_table`) with its
chart (`chart`). Durations and ratios read alike in all of them (`numbers`).
"""

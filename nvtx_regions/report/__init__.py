"""Reports for people: `explain()` (`explanation`), the range tree drawing
(`rangeart`), and what a finished run's files say. One reader (`reader`)
reads Nsight Systems reports (`nsys_report`) and Chrome-trace captures
(`chrome_trace`) into `capture.chrome.RangeRecord` items; from them come
the summary per range, rule and module (`records`), two captures side by
side (`compare`), one rank's run summarized as it is read (`summary`),
backends side by side (`backends_table`) with its chart (`chart`), and every
rank side by side (`ranks_table`) with its chart (`ranks_chart`). Durations and ratios read alike in all of them (`numbers`).
"""

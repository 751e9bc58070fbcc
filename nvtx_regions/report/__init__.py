"""Reports for people: `explain()` (`explanation`), the range tree drawing
(`rangeart`), two captures side by side (`compare`), and the readers of a
finished run's files: Chrome traces (`chrome_trace`) and Nsight Systems
reports (`nsys_report`), both into `capture.chrome.RangeRecord` items, and
their summary per range, rule and module (`records`).
"""

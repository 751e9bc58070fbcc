"""Reports for people: `explain()` (`explanation`), the range tree drawing
(`rangeart`), two captures side by side (`compare`), Nsight Systems reports
read into range records (`nsys_report`), and their summary per range, rule and
module (`records`).
"""

"""Reports for people: `explain()` (`explanation`), the range tree drawing
(`rangeart`), and two captures side by side (`compare`).
"""

"""Ranges that really happen: the thunder transform that rewrites a trace
(`transform`), the run-time state it calls (`runtime`), and the same rules as
hooks on an eager model (`eager`). Imports the layers below.
"""

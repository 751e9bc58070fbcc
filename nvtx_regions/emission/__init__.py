"""Ranges that really happen: the thunder transform (`transform`: configuration
and thunder's entry point; `rewrite`: the new trace with push and pop bound
symbols; `nothing_selected`: when to say a rule selected nothing), the run-time
state the rewritten trace calls (`runtime`; `unwind_watch`: where a failed
call stopped, from ``sys.monitoring`` on Python 3.12+), and the same rules as hooks on an
eager model (`eager_rules`: which module calls; `eager`: the hooks). Imports
the layers below.
"""

"""Ranges that really happen: the thunder transform (`transform`: configuration
and thunder's entry point; `rewrite`: the new trace with push and pop bound
symbols; `nothing_selected`: when to say a rule selected nothing), the run-time
state the rewritten trace calls and its recovery after a failed call
(`runtime`), and the same rules as hooks on an
eager model (`eager_rules`: which module calls; `eager`: the hooks). Imports
the layers below.
"""

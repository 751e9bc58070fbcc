"""Ranges that really happen: the thunder transform (`transform`: configuration
and thunder's entry point; `rewrite`: the new trace with push and pop bound
symbols; `nothing_selected`: when to say a rule selected nothing), the run-time
state the rewritten trace calls and its recovery after a failed call
(`runtime`), and the same rules as hooks on an
eager model (`eager_view`: the module tree as a view that selection plans
on; `eager`: the hooks that put the plan's ranges around module calls).
Imports the layers below.
"""

"""Two of the three emitters: the thunder transform (`transform`: configuration
and thunder's entry point; `rewrite`: the new trace with push and pop bound
symbols; `nothing_selected`: when to say a rule selected nothing), and the same
rules as hooks on an eager model (`eager_view`: the module tree as a view that
selection plans on; `eager`: the hooks that put the plan's ranges around module
calls). What their lines and hooks call at run time is `nvtx_regions.runtime`.
Imports the layers below.
"""

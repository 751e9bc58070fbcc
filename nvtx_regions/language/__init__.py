"""The selector language: spec text to a frozen tree and back.

`grammar` loads ``grammar/nvtx_regions.lark`` (the one copy of the syntax) and
derives from it what other modules know of the syntax, `tree` holds the node
types, `parse` turns text into a tree, and `syntax_messages` turns lark's
errors into the user's words. Imports only `core`.
"""

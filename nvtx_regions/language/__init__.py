"""The selector language: spec text to a frozen tree and back.

`tree` holds the node types, `parse` turns text into a tree with the grammar in
``grammar/nvtx_regions.lark`` (the one copy of the syntax), and
`syntax_messages` turns lark's errors into the user's words. Imports only
`core`.
"""

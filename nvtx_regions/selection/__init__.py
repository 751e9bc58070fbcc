"""From a compiled spec and a trace to a plan of ranges.

`selectors` evaluates filters over a trace view, `compile` turns a spec tree
into one compiled rule per kind (op rules, regions, `each` rules) with
run-time `Gate`s, `markers` selects the occurrences of the user's own NVTX
markers, `plan` lays the ranges of all rules over one trace (start/end ranges
where the compiler interleaved `each` ranges), `unselected` tells which rules
selected nothing and why, `support` is the one table of what each backend
can express (and leaves the rest out), and `explanation` is what a spec
selected, per rule and program, on any backend. `view` is the protocol of
what selection reads of a program. Imports `core`, `language`,
`attribution` and `internals`.
"""

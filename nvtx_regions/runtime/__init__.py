"""What runs while the model runs, the same under every emitter: one runtime, three front ends.

The thunder transform writes trace lines, `NvtxInductor` wrapper lines, and
eager annotation installs module hooks; each only decides *where* its calls
go. What those calls do lives here:

- `domain`: an NVTX domain, the prebuilt event attributes of its ranges, and
  the functions that push and pop them (nvtx's C functions, or C no-ops when
  no tool is attached or a gate is closed).
- `clock`: the step clock every ``steps a..b`` gate reads (`nvtx_regions.steps`'
  iteration, else the optimizer steps), and this process's rank.
- `ranges`: the ranges of one generated function (a thunder trace, an
  Inductor wrapper): each call's gates, and the guard that closes what a
  call that raises left open, as the exception leaves it.

Imports `core`, `internals` and `selection` (for `Gate`).
"""

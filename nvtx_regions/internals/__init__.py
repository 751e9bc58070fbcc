"""Every reach into the private parts of thunder, torch and nvtx, in one place.

Each entry says which version it was checked on (`versions.TESTED`) and what
breaks without it. Everything outside this sub-package uses public APIs only
(tests/test_architecture.py checks it). It imports `core` only.

- `installs`: the one owner of every change nvtx_regions makes outside its
  own objects (torch's, nvtx's, thunder's), made once, held by the live
  handles and put back, each by identity, by the last handle's ``remove()``.
- `patches`: every change made to thunder (the guard around each trace's
  callable among them), with `install(markers)` (when the
  first transform is made, never at import) and `uninstall()`; a patch that
  cannot be applied, or fails, is reported with what is lost.
- `versions`: the tested thunder and torch versions, checked once at install.
- `recorder`: the module recorder, the module calls and markers on each op's
  ``source_filename`` (`AttributedFilename`).
- `lookasides`: thunder interpreter lookasides for the NVTX marker APIs.
- `thunderfx`: what torch.fx and dynamo record (module calls of an FX node,
  static inputs, graph breaks at markers), and whether ThunderFX compiles now.
- `thunder`: what thunder's bound symbols and traces carry (the records,
  parameters, cotangents), the bound symbols the transform builds, the
  guards around the callables thunder builds from its traces, and the
  transforms given to a thunder.jit keyword that thunder ignores.
- `frames`: frame walks (the caller's line, whether a backward follows), and
  where a failed call stopped (a traceback's frame, its line, its locals).
- `autograd`: torch's private autograd state for the eager hooks.
- `dynamo`: Dynamo's and AOTAutograd's run time (a compiled graph's call, its
  backward node, the recompile limit, what Dynamo is tracing), and
  `run_outside_dynamo`, the one way every hook and callback nvtx_regions
  installs is made: Dynamo compiles none of them, nor anything they call.
- `nvtx_calls`: nvtx's C functions for the runtime.
- `inductor`: Inductor's code generation, where the ranges go; `inductor_origins`:
  what the FX nodes say of their modules; `inductor_reaches`: everything of
  torch these reach into, checked in the installed torch before use.
"""

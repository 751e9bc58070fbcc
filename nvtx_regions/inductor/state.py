"""The Inductor wing's process-wide state, all of it: what outlives one backend or is shared by several.

A backend's own state is in its placer and tracker. The module globals below are the rest, the only
ones in the wing (`tests/test_architecture.py` keeps it so). Each holds weakly what it holds of a
backend, a model or a wrapper, so that none keeps what the user dropped:

- `backends`: per cache key, the backend a loaded wrapper reports to (weak values; `tracker`);
- `alive`: every backend alive, for `tracker.release` to find another of the same key (weak);
- `loaded_ranges`: per key, the runtimes of its loaded wrappers, silenced by the key's last
  ``remove()`` (weak; `tracker`);
- `compiling`: per thread, the backend compiling and its graph's number, while it compiles (`tracker`);
- `every_model`: per key, the one `outside.EveryModel` its backends share (weak values);
- `hooked`: per model, the `outside.OutsideCalls` whose hooks are on it (weak keys);
- `whole_forwards`: per model, the forward functions of its modules Dynamo compiled whole, to their
  return, for any of its backends (weak keys; `first_step`): the hooks of one backend's first step
  run around a layer another compiled (a backend per layer), and not another model's, which Dynamo
  may run otherwise;
- `compiled_for`: per function Dynamo compiled for an `NvtxInductor`, as Dynamo names it, the
  backends it compiled it for (weak; `dynamo_events`);
- `limits_said`: the functions whose recompile limit was said (names: once a process; `dynamo_events`).
- `drops_said`: the profiler functions whose drop from compiled code was said (names: once a process;
  `dynamo_events`).

What the wing changes outside its own objects (Inductor's code generation, Dynamo's config) is
`internals.installs`'s, put back by the last live handle's ``remove()``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

backends: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
alive: "weakref.WeakSet[Any]" = weakref.WeakSet()
loaded_ranges: "dict[str, weakref.WeakSet[Any]]" = {}
compiling = threading.local()
every_model: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
hooked: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
whole_forwards: "weakref.WeakKeyDictionary[Any, set[Any]]" = weakref.WeakKeyDictionary()
compiled_for: "dict[str, weakref.WeakSet[Any]]" = {}
limits_said: set[str] = set()
drops_said: set[str] = set()

"""Module hooks that Dynamo traces alike on every module: one hook id per annotation and kind.

torch's ``Module._call_impl`` asks, of each hook, ``hook_id in self._forward_pre_hooks_with_kwargs``
and ``hook_id in self._forward_hooks_always_called``. Dynamo, tracing a forward that calls a hooked
module, guards on those answers, keyed by the hook's id, and every registration takes a new id
(``RemovableHandle.next_id``). So the same code run with the next layer fails the guard: a plain
per-layer ``torch.compile`` of an annotated model recompiled once per layer, and past Dynamo's
recompile limit (8) ran the rest uncompiled. Under one id per annotation and kind, every layer passes
the guards of the first. Checked on torch 2.8, 2.11 and 2.14.1 (``RemovableHandle``'s ``id``,
``hooks_dict_ref`` and ``extra_dict_ref``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["HookIds", "register_hooks"]


def _new_id() -> int:
    """An id no other hook of the process has or will have: the next of torch's own counter."""
    from torch.utils.hooks import RemovableHandle

    return RemovableHandle(OrderedDict()).id


class HookIds:
    """The two hook ids of one annotation: its forward pre-hooks' and its forward hooks'."""

    def __init__(self) -> None:
        self.pre = _new_id()
        self.post = _new_id()


def register_hooks(module: Any, pre_hook: Any, post_hook: Any, *, with_kwargs: bool, ids: HookIds) -> list[Any]:
    """Register `pre_hook` (``with_kwargs``) and `post_hook` (``always_call=True``) on `module`, each
    under its id of `ids`; their handles, whose ``remove()`` takes them off as any handle's does."""
    pre = module.register_forward_pre_hook(pre_hook, with_kwargs=with_kwargs)
    post = module.register_forward_hook(post_hook, always_call=True)
    _rekey(pre, ids.pre)
    _rekey(post, ids.post)
    return [pre, post]


def _rekey(handle: Any, new_id: int) -> None:
    """Move the hook of `handle` (the last one registered, so its place does not change) to `new_id`
    in its dict and in the dicts that flag it, unless the module has a hook of that id already."""
    hooks = handle.hooks_dict_ref()
    if hooks is None or new_id in hooks or handle.id not in hooks:
        return
    old = handle.id
    hooks[new_id] = hooks.pop(old)
    for ref in handle.extra_dict_ref:
        flags = ref()
        if flags is not None and old in flags:
            flags[new_id] = flags.pop(old)
    handle.id = new_id

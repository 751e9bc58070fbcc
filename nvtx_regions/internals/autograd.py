"""Private torch autograd state that the eager hooks (`emission.eager`) read."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

__all__ = ["AutogradInternals", "autograd_internals", "full_backward_hook_flag", "restore_full_backward_hook_flag"]


class AutogradInternals(NamedTuple):
    """Private torch autograd functions the eager hooks call, looked up once.

    Checked on torch 2.11:
    - ``graph_task_id()`` is ``torch._C._current_graph_task_id``: the id of the
      backward (graph task) running on this thread, -1 outside any. Without it
      ranges that a failed backward left open could not be told apart from the
      ranges of a backward in progress, and would stay open.
    - ``autograd_node()`` is ``torch._C._current_autograd_node``: the autograd
      node being run. Without it a module none of whose inputs needs a gradient
      (torch calls its full backward hook right after the pre-hook) would close
      its backward range before its backward ran.
    - ``queue_callback(fn)`` is ``torch.autograd.Variable._execution_engine.queue_callback``:
      runs `fn` when the current backward ends. Without it ranges still open
      when a backward succeeds (deferred ones) would close only at the next forward.
    """

    graph_task_id: Callable[[], int]
    autograd_node: Callable[[], Any]
    queue_callback: Callable[[Callable[[], None]], None]


def autograd_internals() -> AutogradInternals:
    import torch

    return AutogradInternals(
        torch._C._current_graph_task_id,
        torch._C._current_autograd_node,
        torch.autograd.Variable._execution_engine.queue_callback,
    )


def full_backward_hook_flag(module: Any) -> Any:
    """A module's private ``_is_full_backward_hook`` (torch 2.11: None until a backward hook is registered,
    then True for full hooks and False for ``register_backward_hook``).

    `annotate()` saves it before registering its full backward hooks and
    restores it on `remove()`; without that, a module whose only full hooks
    were ours would keep refusing a later ``register_backward_hook``.
    """
    return module._is_full_backward_hook


def restore_full_backward_hook_flag(module: Any, flag: Any) -> None:
    """Put back what `full_backward_hook_flag` read (see there)."""
    module._is_full_backward_hook = flag

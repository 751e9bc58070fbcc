"""Private torch autograd state that the eager hooks (`emission.eager`) and the hooks on calls outside
Inductor's graphs (`inductor.outside`) read."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

__all__ = ["AutogradInternals", "autograd_internals"]


class AutogradInternals(NamedTuple):
    """Private torch autograd functions the hooks call, looked up once.

    Checked on torch 2.11 and 2.14.1:
    - ``graph_task_id()`` is ``torch._C._current_graph_task_id``: the id of the
      backward (graph task) running on this thread, -1 outside any. Without it
      ranges that a failed backward left open could not be told apart from the
      ranges of a backward in progress, and would stay open.
    - ``queue_callback(fn)`` is ``torch.autograd.Variable._execution_engine.queue_callback``:
      runs `fn` when the current backward ends. Without it ranges still open
      when a backward succeeds (a call none of whose inputs needs a gradient)
      would close only at the next forward.
    - ``current_node()`` is ``torch._C._current_autograd_node`` (2.8 too): the
      autograd node whose backward runs on this thread now, None outside any.
      Without it a compiled graph's backward would learn which module instance
      its forward ran for only from a pre-hook on its node, registered per call
      and called per backward (`runtime.ranges.name_backward`).
    """

    graph_task_id: Callable[[], int]
    queue_callback: Callable[[Callable[[], None]], None]
    current_node: Callable[[], Any]


def autograd_internals() -> AutogradInternals:
    import torch

    return AutogradInternals(
        torch._C._current_graph_task_id, torch.autograd.Variable._execution_engine.queue_callback,
        torch._C._current_autograd_node,
    )  # fmt: skip

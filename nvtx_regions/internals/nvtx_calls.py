"""The nvtx package's private parts that the generated lines call (`runtime.domain`).

Checked on nvtx 0.2.17 with Python 3.11.7 and 3.12.1.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["c_push_pop", "c_start_end", "unasked_domain"]


def c_push_pop() -> tuple[Callable[[Any, Any], Any], Callable[[Any], Any]] | None:
    """nvtx's C functions ``push_range(attributes, domain handle)`` and ``pop_range(domain handle)``,
    or None where this nvtx has no such module.

    nvtx 0.2.17: ``nvtx._lib.lib`` is the Cython module behind ``Domain.push_range``
    and ``Domain.pop_range``; those methods also parse ``**kwargs`` and look the
    handle up, about 40% of a range's cost with a tool attached. Without it a
    range is one Python method call slower on each line.
    """
    try:
        from nvtx._lib.lib import pop_range, push_range
    except ImportError:
        return None
    return push_range, pop_range


def c_start_end() -> tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]] | None:
    """nvtx's C functions ``start_range(attributes, domain handle) -> (range id, domain handle)``
    and ``end_range(range id, domain handle)``, or None where this nvtx has no such module.

    nvtx 0.2.17, as `c_push_pop`: without them a start/end range costs the
    `Domain` methods' keyword parsing on each line.
    """
    try:
        from nvtx._lib.lib import end_range, start_range
    except ImportError:
        return None
    return start_range, end_range


@functools.lru_cache(maxsize=None)
def unasked_domain(name: str | None) -> Any:
    """nvtx's `Domain` for `name`, built without asking ``nvtxDomainIsEnabled``; one per name,
    as `nvtx.get_domain` keeps (category ids are numbered per object, and dropping the
    handle destroys the NVTX domain).

    nvtx 0.2.17: ``Domain.__new__`` asks ``nvtxDomainIsEnabled`` and hands out a
    ``DummyDomain`` when the answer is no; ``__init__`` only fills in the rest,
    around the ``DomainHandle`` set here. Nsight Systems 2022.4 does not
    implement that question and answers no, so without this every range would
    be silently lost under it (see `runtime.domain.nvtx_domain`).
    """
    from nvtx._lib.lib import Domain, DomainHandle

    domain = object.__new__(Domain)
    domain.handle = DomainHandle(name)
    domain.__init__(name)
    return domain

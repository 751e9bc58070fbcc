"""The public path of eager annotation: ``from nvtx_regions.eager import annotate``.

The code lives in `nvtx_regions.emission.eager`.
"""

from .emission.eager import EagerAnnotation, annotate

__all__ = ["annotate", "EagerAnnotation"]

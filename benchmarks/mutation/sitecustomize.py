# For the mutation run only (tests/test_long.py, PYTHONPATH=benchmarks/mutation): the editable install in .venv maps nvtx_regions
# to the main checkout, and mutmut drops the mutated copy from sys.path.
# Replace that finder with one for the mutated copy.
import os
import sys
from importlib.machinery import PathFinder

_MUTANTS = os.environ["NVTX_REGIONS_MUTANTS"]


class _MutatedCopy:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "nvtx_regions":
            return PathFinder.find_spec(name, [_MUTANTS])
        return None


sys.meta_path[:] = [_MutatedCopy] + [f for f in sys.meta_path if "editable" not in repr(f).lower()]

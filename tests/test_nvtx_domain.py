"""Where nvtx_regions' NVTX domains come from: nvtx's dummy domain with no tool, a real one with a tool.

Under Nsight Systems 2022.4 nvtx's own test (``nvtxDomainIsEnabled``) says "no
tool" although one is attached; tests/test_nsys_real.py shows the ranges there.
Here, a tool that NVTX was told to load but cannot (a path to no library)
takes the same path without nsys.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import nvtx
    from nvtx_regions.runtime.domain import SKIP_PUSH, Domain, calls_of, nvtx_domain
    a, b = nvtx_domain("probe"), nvtx_domain("probe")
    push = calls_of(Domain("probe")).push
    print(type(nvtx.get_domain("probe")).__name__, type(a).__name__, a is b, push is SKIP_PUSH,
          a.get_category_id("x") == a.get_category_id("x"))
""")


def probe(**env: str) -> list[str]:
    import os

    environment = {k: v for k, v in os.environ.items() if k != "NVTX_INJECTION64_PATH"} | env
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_no_tool_keeps_the_dummy_domain_and_c_no_ops():
    assert probe() == ["DummyDomain", "DummyDomain", "True", "True", "True"]


def test_a_tool_gets_a_real_domain_even_when_nvtx_says_disabled():
    assert probe(NVTX_INJECTION64_PATH="/nonexistent/libtool.so") == ["DummyDomain", "Domain", "True", "False", "True"]

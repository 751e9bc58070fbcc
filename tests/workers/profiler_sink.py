"""A child process for tests/test_emit.py: two blocks, 3 training steps in a `nvtx_regions.steps`
loop, under torch.profiler, with the spec's ranges emitted to the sinks asked for.

    python profiler_sink.py BACKEND EMIT TRACE.json

EMIT is what ``emit=`` gets ("nvtx,record_function" becomes a tuple). The Chrome trace goes
to TRACE.json; the NVTX ranges to the capture tool, where it runs this.
"""

import sys
import warnings

import torch

import nvtx_regions
import nvtx_regions.runtime.domain

warnings.simplefilter("ignore")
backend, emit, trace = sys.argv[1], tuple(sys.argv[2].split(",")), sys.argv[3]
SPEC = """
each module <blocks.*>
each class <Linear> and steps 1..2 and forward
"""


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.sum()


torch.manual_seed(0)
model = Net()
compiled = nvtx_regions.compile(model, SPEC, backend=backend, emit=emit)
x = torch.randn(4, 16, requires_grad=True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
    for step in nvtx_regions.steps(range(3), emit=emit):
        compiled(x).backward()
profiler.export_chrome_trace(trace)
# A range of the worker's own, in another domain: the capture tool's control.
nvtx_regions.runtime.domain.nvtx_domain("worker").push_range(message="worker done")
print("done")

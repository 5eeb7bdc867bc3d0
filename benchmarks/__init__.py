"""Speed and memory of the package beside its peers. Each benchmark is a script run
from the repository root as `python -m benchmarks.NAME`; the modules without a
`main` are what the scripts share (workload, clocks, peak memory, peers, parts)."""

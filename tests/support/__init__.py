"""What several test modules share: float64 references, upstream files written by
the upstreams, tolerances, the forked-process runner, small data files."""

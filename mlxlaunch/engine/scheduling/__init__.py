"""engine/scheduling: the worker loop, jobs, duplicate sharing, the idle sweeper and the
first-token hand-off."""

"""Router mode: `localspec serve` without a model serves every model it knows, each in its own runner process
(catalog.py: the models; runner.py: one process; pool.py: which run, loading, eviction, idle unload;
memory.py: the estimate a load must fit; fault.py and child.py: the runner's entry point and its test fault).
Only the router imports this package; it never imports llama_cpp."""

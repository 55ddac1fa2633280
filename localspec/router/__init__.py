"""Router mode: `localspec serve` without a model serves every model it knows, each in its own runner process
(discover.py: the models; process.py: one runner; pool.py: which run, loading, eviction, idle unload; memory.py:
the estimate a load must fit; choice.py: which model a request is for; proxy.py: the hop to its runner).
Only the router imports this package; it never imports llama_cpp."""

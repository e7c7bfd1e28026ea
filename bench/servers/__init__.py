"""What the benchmark measures: the servers under test and the packages they serve.

:mod:`bench.servers.launch` starts histoserve (batching on or off, or at its
defaults) and the naive baseline as subprocesses with one environment;
:mod:`~bench.servers.naive` is baseline (b), stock KServe's straightforward
model; :mod:`~bench.servers.before` extracts the server of an earlier commit
for before-and-after cells; :mod:`~bench.servers.packages` gives the cached
random-weight packages and :mod:`~bench.servers.null_model` the package whose
forward costs next to nothing. NVIDIA Triton is :mod:`bench.triton`.
"""

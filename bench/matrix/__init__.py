"""The end-to-end matrix of ``make bench``: the limit, the cells and the target cells.

:mod:`bench.matrix.limit` is the package's own forward in process (what no
server can beat); :mod:`~bench.matrix.cells` plans the matrix of (server,
protocol, clients, tiles) cells, sizes their windows and drives the load
process; :mod:`~bench.matrix.targets` measures idle latency and the target
cells side by side so that their ratios survive a noisy host.
"""

"""The model layer: the KServe model adapter and lifecycle, admission, the decode pool, stage calls, metrics."""

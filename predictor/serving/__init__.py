"""The model layer: the seed's ``BaseServerModel`` (its hooks, KServe and the lifecycle), admission, the decode pool, stage calls, metrics."""

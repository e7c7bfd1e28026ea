"""What a ``.pt2`` package file is, read without loading it: the facts start-up and export decide on.

* :mod:`~predictor.packages.dtypes`: the one dtype-name table of the project;
* :mod:`~predictor.packages.digest`: SHA-256 of a package, verified once at start-up;
* :mod:`~predictor.packages.extract`: one zip member found, or written out CRC-checked;
* :mod:`~predictor.packages.metadata`: the metadata, read from the zip, every field checked;
* :mod:`~predictor.packages.weights_layout`: where a package keeps its weights (built and read back);
* :mod:`~predictor.packages.host`: what this host can run, and whether a package's build fits it;
* :mod:`~predictor.packages.build_key`: what a package was built from and for, as one name;
* :mod:`~predictor.packages.phases`: the seconds each start-up phase took;
* :mod:`~predictor.packages.facts`: the candidates of a model directory, their one hash, the
  batch range against the serving bound;
* :mod:`~predictor.packages.package_set`: which package of a model directory fits this host;
* :mod:`~predictor.packages.probe_record`: which packages this host has loaded before.

Nothing here loads or runs a package's code (that is :mod:`predictor.runtime`),
and no module imports torch when imported (a few call it when asked for a
torch dtype or this runtime's versions), so the exporter's checks and
start-up's choice read packages cheaply. Import the submodule you need; this
package re-exports nothing. Submodules import only downwards in the list
above, never back.
"""

"""``.pt2`` packages: everything between a file on disk and a callable model.

* :mod:`~predictor.pt2.dtypes`: the one dtype-name table of the project;
* :mod:`~predictor.pt2.digest`: SHA-256 of a package, verified once at start-up;
* :mod:`~predictor.pt2.metadata`: the metadata, read from the zip without loading;
* :mod:`~predictor.pt2.weights_layout`: where a package keeps its weights (built and read back);
* :mod:`~predictor.pt2.host`: what this host can run, the serving device;
* :mod:`~predictor.pt2.build_key`: what a package was built from and for, as one name;
* :mod:`~predictor.pt2.genes`: the gene-list CSVs beside multimodal packages;
* :mod:`~predictor.pt2.loader`: find, verify, check and load, with phase timings;
* :mod:`~predictor.pt2.package_set`: which package of a model directory fits this host;
* :mod:`~predictor.pt2.probe`: run the loaded package on the spec's inputs.

Import the submodule you need; this package re-exports nothing, so importing
``predictor.pt2.genes`` (or ``digest``) does not load torch. Submodules
import only downwards in the list above (``loader`` <- ``probe``), never back.
"""

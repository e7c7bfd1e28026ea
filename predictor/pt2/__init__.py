"""Demo modules and gene lists of the families: what ``histoserve export --demo`` compiles.

* :mod:`~predictor.pt2.demo_models`: random-weight tile models with each spec's geometry;
* :mod:`~predictor.pt2.slide_models`: the slide heads (gated ABMIL, mean pooling);
* :mod:`~predictor.pt2.genes`: the gene-list CSVs beside multimodal packages.

What a package file is lives in :mod:`predictor.packages`, how one runs in
:mod:`predictor.runtime`. These modules belong to their families (each
family's demo model beside its spec section), where they are moving.
"""

"""How a ``.pt2`` package runs: loaded onto its device, called, probed, loaded first in a child.

* :mod:`~predictor.runtime.device_context`: the device (and stream) current whenever a
  thread calls into a package;
* :mod:`~predictor.runtime.input_checks`: what a package's inputs must be, checked in Python;
* :mod:`~predictor.runtime.aoti_runner`: the GIL-free runner (the package's C ABI via ctypes);
* :mod:`~predictor.runtime.runners`: the two runners built: torch's loader called flat, or
  the GIL-free one;
* :mod:`~predictor.runtime.loader`: a package loaded once, behind one callable;
* :mod:`~predictor.runtime.probe`: the loaded package run on the spec's inputs;
* :mod:`~predictor.runtime.load_probe` and :mod:`~predictor.runtime.load_child`: the load
  run once in a child process that may die, before this one trusts it;
* :mod:`~predictor.runtime.devices`: which devices ``--device`` names, their math settings.

What a package file is, read without loading it, is :mod:`predictor.packages`,
below this one. Import the submodule you need; this package re-exports nothing.
"""

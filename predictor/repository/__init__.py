"""The model repository: a ``--model_dir`` of one folder per model, served by one process.

Which folders are models and what each is called (``layout``), a model's own
settings file (``settings``), what a loaded model's memory costs and the
budget it must fit (``memory``), the models' states with the repository
extension's index, load and unload (``repository``), and a load's thread at a
lower OS priority than the serving models' (``background``). Models are built by the
entry layer's start-up, handed in as a function, so this folder sits above the
front door's callers only by what it is given.
"""

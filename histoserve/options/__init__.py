"""The options of ``histoserve embed``: how each is declared, once, and which values each accepts.

:mod:`~histoserve.options.declare` makes a dataclass field the one declaration
of an option (flag, keyword, kind, default, help); the declarations
themselves are :class:`histoserve.embedding.config.EmbedConfig`'s fields.
:mod:`~histoserve.options.checks` holds the checks of their values that the
config runs.
"""

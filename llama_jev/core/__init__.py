"""Layer 0, the shared core: identity and its binding, records and options, the error tree.

Everything else imports from here; nothing here imports from the rest of the package.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

"""Every error llama_jev raises, from the base class :class:`JevError` down.

Catch :class:`JevError` for all of them; ``RetrievalUnavailableError`` (the judge failed) and
``RetrievalInconclusiveError`` (nothing certain) are the two a retrieval in ENFORCE raises, and
:class:`JevAPIError`'s subclasses say how a System One call failed (``status_code``, ``retryable``).

Names are listed once, in ``errors.pyi``, and load on first use.

Example:
    >>> from llama_jev.errors import JevError, RetrievalUnavailableError
    >>> issubclass(RetrievalUnavailableError, JevError)
    True
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

"""Layer 2, the store adapters: the ACL pushed down into each vector store pushdown speaks.

One module per store (``memory``, ``qdrant``, ``postgres``, ``chroma``). Each recognises its
vector store and turns a ``(MetadataAcl, RuntimeContext)`` into that store's native restriction,
with every value bound by the store's client, never pasted into a query string. ``JevRetriever``
asks this package (``registry``); it holds no store-specific code, and neither does the registry:
a store outside the package is one :class:`Pushdown` subclass passed to :func:`register`.
"""

import warnings
from typing import Any

from llama_jev._exports import attach

_getattr, __dir__, __all__ = attach(__name__, __file__)


def __getattr__(name: str) -> Any:
    if name == "ADAPTERS":  # 0.1's fixed tuple; adapters() also lists those added with register()
        warnings.warn(
            "llama_jev.stores.ADAPTERS is replaced by llama_jev.stores.adapters() (the old name goes in 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        return tuple(_getattr("adapters")())
    return _getattr(name)

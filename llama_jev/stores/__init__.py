"""Layer 2, the store adapters: the ACL pushed down into each vector store pushdown speaks.

One module per store (``memory``, ``qdrant``, ``postgres``, ``chroma``). Each recognises its
vector store and turns a ``(MetadataAcl, RuntimeContext)`` into that store's native restriction,
with every value bound by the store's client, never pasted into a query string. ``JevRetriever``
asks this package (``registry``); it holds no store-specific code, and neither does the registry:
a store outside the package is one :class:`Pushdown` subclass passed to :func:`register`.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

"""Layer 5, the LlamaIndex pieces: ``JevRetriever``, ``JevNodePostprocessor`` and the
``search_knowledge`` tool, thin adapters over the engine.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

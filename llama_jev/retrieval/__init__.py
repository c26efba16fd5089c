"""Layer 5, the LlamaIndex pieces: ``JevRetriever``, ``JevNodePostprocessor`` and the
``search_knowledge`` tool, thin adapters over the engine."""

"""Layer 4, the judgement engine: the ``CandidateSelector`` (batches, budget, classification,
modes, records) and the pipeline that runs ACL -> judgement -> decision for every entry point.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

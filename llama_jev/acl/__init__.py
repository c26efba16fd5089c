"""Layer 1, who may read a node: the ``Acl`` type, ``MetadataAcl``, ``check_acl`` and the
warnings that turn a silent misconfiguration into a log line."""

from llama_jev.acl.rules import Acl, FilterStore, MetadataAcl, check_acl

__all__ = ["Acl", "FilterStore", "MetadataAcl", "check_acl"]

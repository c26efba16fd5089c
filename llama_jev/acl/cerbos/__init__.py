"""Cerbos: permissions from a Cerbos PDP, everything about it in one folder.

- ``acl``: :class:`CerbosAcl`, the ACL (PlanResources as a restriction, CheckResources as the
  final check, batched and concurrent);
- ``plan``: a query plan read into the condition language, operator by operator;
- ``wire``: requests and answers as data (principal, resources, batches);
- ``client``: the HTTP and gRPC I/O.
"""

from llama_jev.acl.cerbos.acl import CerbosAcl

__all__ = ["CerbosAcl"]

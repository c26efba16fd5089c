"""SpiceDB: permissions from a SpiceDB server, everything about it in one folder.

- ``acl``: :class:`SpiceDBAcl`, the ACL (LookupResources as an id allow-list, CheckBulkPermissions
  as the final check) and its gRPC calls;
- ``wire``: requests built and answers read, with no I/O.
"""

from llama_jev.acl.spicedb.acl import SpiceDBAcl

__all__ = ["SpiceDBAcl"]

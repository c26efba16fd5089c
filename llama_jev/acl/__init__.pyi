"""Layer 1, who may read a node: the ``Acl`` type, ``MetadataAcl`` and ``check_acl``."""

from llama_jev.acl.rules import (
    Acl as Acl,
)
from llama_jev.acl.rules import (
    AclTerms as AclTerms,
)
from llama_jev.acl.rules import (
    FilterStore as FilterStore,
)
from llama_jev.acl.rules import (
    MetadataAcl as MetadataAcl,
)
from llama_jev.acl.rules import (
    check_acl as check_acl,
)

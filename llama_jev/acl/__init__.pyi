"""Layer 1, who may read a node: the ``Acl`` type, ``MetadataAcl`` and ``check_acl``."""

from llama_jev.acl.batch import (
    BatchAcl as BatchAcl,
)
from llama_jev.acl.batch import (
    CallableAcl as CallableAcl,
)
from llama_jev.acl.batch import (
    acheck_allowed as acheck_allowed,
)
from llama_jev.acl.batch import (
    batch_acl as batch_acl,
)
from llama_jev.acl.batch import (
    checked_allowed as checked_allowed,
)
from llama_jev.acl.cerbos.acl import (
    CerbosAcl as CerbosAcl,
)
from llama_jev.acl.conditions import (
    And as And,
)
from llama_jev.acl.conditions import (
    Condition as Condition,
)
from llama_jev.acl.conditions import (
    Conditional as Conditional,
)
from llama_jev.acl.conditions import (
    Equals as Equals,
)
from llama_jev.acl.conditions import (
    Everything as Everything,
)
from llama_jev.acl.conditions import (
    IdIn as IdIn,
)
from llama_jev.acl.conditions import (
    Ids as Ids,
)
from llama_jev.acl.conditions import (
    In as In,
)
from llama_jev.acl.conditions import (
    Intersects as Intersects,
)
from llama_jev.acl.conditions import (
    ListContains as ListContains,
)
from llama_jev.acl.conditions import (
    Not as Not,
)
from llama_jev.acl.conditions import (
    Nothing as Nothing,
)
from llama_jev.acl.conditions import (
    Or as Or,
)
from llama_jev.acl.conditions import (
    Restriction as Restriction,
)
from llama_jev.acl.conditions import (
    RestrictionKind as RestrictionKind,
)
from llama_jev.acl.conditions import (
    Unknown as Unknown,
)
from llama_jev.acl.conditions import (
    evaluate as evaluate,
)
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
from llama_jev.acl.spicedb.acl import (
    SpiceDBAcl as SpiceDBAcl,
)

"""Layer 2, the store adapters: the ACL pushed down into each vector store pushdown speaks."""

from llama_jev.stores.base import (
    KeyCensus as KeyCensus,
)
from llama_jev.stores.base import (
    Pushdown as Pushdown,
)
from llama_jev.stores.chroma import (
    chroma_condition as chroma_condition,
)
from llama_jev.stores.chroma import (
    chroma_where as chroma_where,
)
from llama_jev.stores.drift import (
    DriftReport as DriftReport,
)
from llama_jev.stores.drift import (
    check_drift as check_drift,
)
from llama_jev.stores.grants import (
    GrantsError as GrantsError,
)
from llama_jev.stores.grants import (
    Retagger as Retagger,
)
from llama_jev.stores.grants import (
    RetagIncompleteError as RetagIncompleteError,
)
from llama_jev.stores.grants import (
    RetagResult as RetagResult,
)
from llama_jev.stores.grants import (
    Stored as Stored,
)
from llama_jev.stores.grants import (
    checked_grants as checked_grants,
)
from llama_jev.stores.memory import (
    simple_filters as simple_filters,
)
from llama_jev.stores.postgres.row_security import (
    row_security_ddl as row_security_ddl,
)
from llama_jev.stores.postgres.store import (
    AclPGVectorStore as AclPGVectorStore,
)
from llama_jev.stores.qdrant import (
    qdrant_condition as qdrant_condition,
)
from llama_jev.stores.qdrant import (
    qdrant_filters as qdrant_filters,
)
from llama_jev.stores.registry import (
    adapter_for as adapter_for,
)
from llama_jev.stores.registry import (
    adapters as adapters,
)
from llama_jev.stores.registry import (
    advice_for as advice_for,
)
from llama_jev.stores.registry import (
    aretrieve as aretrieve,
)
from llama_jev.stores.registry import (
    pushdown_for as pushdown_for,
)
from llama_jev.stores.registry import (
    register as register,
)
from llama_jev.stores.retagging import (
    aretag as aretag,
)
from llama_jev.stores.retagging import (
    register_retagger as register_retagger,
)
from llama_jev.stores.retagging import (
    retag as retag,
)

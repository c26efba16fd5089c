"""Layer 0, the shared core: identity and its binding, decision records and options."""

from llama_jev.core.audit import JsonlObserver as JsonlObserver
from llama_jev.core.context import (
    RuntimeContext as RuntimeContext,
)
from llama_jev.core.context import (
    current_runtime_context as current_runtime_context,
)
from llama_jev.core.context import (
    resolve_runtime_context as resolve_runtime_context,
)
from llama_jev.core.context import (
    runtime_context as runtime_context,
)
from llama_jev.core.records import (
    DEFAULT_ACCEPT as DEFAULT_ACCEPT,
)
from llama_jev.core.records import (
    DEFAULT_REJECT as DEFAULT_REJECT,
)
from llama_jev.core.records import (
    Decision as Decision,
)
from llama_jev.core.records import (
    DecisionRecord as DecisionRecord,
)
from llama_jev.core.records import (
    ExecutionOptions as ExecutionOptions,
)
from llama_jev.core.records import (
    Mode as Mode,
)
from llama_jev.core.records import (
    Observer as Observer,
)
from llama_jev.core.records import (
    Reason as Reason,
)
from llama_jev.core.records import (
    RetrievalFacts as RetrievalFacts,
)
from llama_jev.core.records import (
    Selection as Selection,
)
from llama_jev.core.records import (
    Status as Status,
)

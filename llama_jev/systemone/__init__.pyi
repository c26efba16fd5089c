"""Layer 3, the System One client: the wire models, the HTTP client, the client-wide governor and
the ``Judge`` protocol every judge (remote, scripted, offline) speaks."""

from llama_jev.systemone.client import (
    JevClient as JevClient,
)
from llama_jev.systemone.client import (
    RetryPolicy as RetryPolicy,
)
from llama_jev.systemone.governor import (
    Governor as Governor,
)
from llama_jev.systemone.governor_stats import (
    GovernorStats as GovernorStats,
)
from llama_jev.systemone.judge import (
    AnswerFunction as AnswerFunction,
)
from llama_jev.systemone.judge import (
    Judge as Judge,
)
from llama_jev.systemone.judge import (
    ScriptedJudge as ScriptedJudge,
)
from llama_jev.systemone.wire import (
    ChoiceAnswer as ChoiceAnswer,
)
from llama_jev.systemone.wire import (
    ChoiceQuestion as ChoiceQuestion,
)
from llama_jev.systemone.wire import (
    NoulAnswer as NoulAnswer,
)
from llama_jev.systemone.wire import (
    NoulCriteria as NoulCriteria,
)
from llama_jev.systemone.wire import (
    NoulQuestion as NoulQuestion,
)
from llama_jev.systemone.wire import (
    ScoreAnswer as ScoreAnswer,
)
from llama_jev.systemone.wire import (
    ScoreQuestion as ScoreQuestion,
)
from llama_jev.systemone.wire import (
    SystemOneRequest as SystemOneRequest,
)
from llama_jev.systemone.wire import (
    SystemOneResult as SystemOneResult,
)
from llama_jev.systemone.wire import (
    Usage as Usage,
)

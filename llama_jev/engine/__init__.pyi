"""Layer 4, the judgement engine: the ``CandidateSelector`` (batches, budget, classification, modes,
records) and what the pipeline puts on nodes and events."""

from llama_jev.engine.nodes import (
    PROBABILITY_KEY as PROBABILITY_KEY,
)
from llama_jev.engine.pipeline import (
    JevDecisionEvent as JevDecisionEvent,
)
from llama_jev.engine.selector import (
    RELEVANCE_QUESTION as RELEVANCE_QUESTION,
)
from llama_jev.engine.selector import (
    Candidate as Candidate,
)
from llama_jev.engine.selector import (
    CandidateSelector as CandidateSelector,
)

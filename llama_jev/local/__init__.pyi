"""Offline embeddings and the offline relevance judge: small ONNX models, no torch, no download."""

from llama_jev.local.cross_encoder import MarcoCrossEncoder as MarcoCrossEncoder
from llama_jev.local.minilm import (
    LocalEmbedding as LocalEmbedding,
)
from llama_jev.local.minilm import (
    MiniLMEncoder as MiniLMEncoder,
)
from llama_jev.local.passages import (
    DEFAULT_MIDPOINT as DEFAULT_MIDPOINT,
)
from llama_jev.local.passages import (
    DEFAULT_SLOPE as DEFAULT_SLOPE,
)
from llama_jev.local.passages import (
    CosineSimilarityJudge as CosineSimilarityJudge,
)
from llama_jev.local.relevance import (
    EXIT_LAYER as EXIT_LAYER,
)
from llama_jev.local.relevance import (
    FEATURES as FEATURES,
)
from llama_jev.local.relevance import (
    LocalRelevanceJudge as LocalRelevanceJudge,
)
from llama_jev.local.relevance import (
    load_parameters as load_parameters,
)
from llama_jev.local.tuned import LayerDelta as LayerDelta
from llama_jev.local.weights import carried_file as carried_file

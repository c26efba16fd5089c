"""Layer 5, the LlamaIndex pieces: ``JevRetriever``, ``JevNodePostprocessor``, the ``search_knowledge``
tool, and the evidence collector the review reads."""

from llama_jev.retrieval.evidence import (
    EvidenceCollector as EvidenceCollector,
)
from llama_jev.retrieval.evidence import (
    collect_evidence as collect_evidence,
)
from llama_jev.retrieval.postprocessor import JevNodePostprocessor as JevNodePostprocessor
from llama_jev.retrieval.retriever import JevRetriever as JevRetriever
from llama_jev.retrieval.tool import JevKnowledgeTool as JevKnowledgeTool

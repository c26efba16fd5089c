"""Layer 4, the judgement engine: the ``CandidateSelector`` (batches, budget, classification,
modes, records) and the pipeline that runs ACL -> judgement -> decision for every entry point."""

"""One τ² episode's parts: the LLM endpoints, the door to τ², dumps."""

"""One τ² episode's parts (core): the LLM endpoints, the door to τ², its group's rewards, its record."""

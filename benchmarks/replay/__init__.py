"""`llm-gateway bench replay`: closed-loop multi-turn replays, per contender and round."""

"""`llm-gateway bench routing`: routers side by side in front of the same fleet and traffic."""

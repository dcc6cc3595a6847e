"""Replica state and the loops that write it: health, score loop, GPU figures, KV events."""

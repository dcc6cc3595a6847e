"""Routing state shared by gateway processes and hosts through Redis (`[shared_state]`)."""

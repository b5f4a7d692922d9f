"""Scaling: the reactive loop, its pure decision, schedule floors, pre-warm, node pools and placement."""

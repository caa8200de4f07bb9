"""``chaosctl bench signing``: what signing the control plane costs per message
(:mod:`.run`).
"""

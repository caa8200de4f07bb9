"""``chaosctl bench duty-cycle``: what periodic bandwidth probing costs a link
(:mod:`.duty_cycle`).
"""

"""``chaosctl bench planner``: planner run time and makespan against water-filling
(:mod:`.run`).
"""

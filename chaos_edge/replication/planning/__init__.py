"""Scale-out planning: pure functions of the planner's inputs, no I/O, numpy only.

Which bytes each neighbour sends a new node: water-filling (the exact optimum over byte
ranges), the paper's Algorithms 1 and 2, brute force and MILP for small instances, and
re-planning the bytes of a neighbour that failed. Called from the worker's threads and from
the benchmarks; nothing here blocks.
"""

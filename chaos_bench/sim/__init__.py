"""``chaosctl bench simulate``: a discrete-event simulation (SimPy) of Chaos to 10,000 nodes.

The simulation runs the project's real pure logic and simulates only time and the network:

| module         | what                                                                      |
| -------------- | ------------------------------------------------------------------------- |
| ``network``    | links with a rate and a latency, flows in chunks, hop by hop (SimPy)      |
| ``topology``   | the testbed's random topology (node i links to 3 earlier nodes), routes   |
| ``scaleout``   | one scale-out under each strategy, planned by the real planners           |
| ``validate``   | replays the netns testbed's instances and reports the error per point     |
| ``sweep``      | scale-out delay and idle time against N, 12 to 10,000 nodes               |
| ``broker``     | broker load of both heartbeat patterns, saturation, the real snapshot     |
| ``failover``   | detection (the real phi-accrual) and election (the real ranking) at N     |
| ``churn``      | Poisson joins, leaves and failures through the real negotiator            |
| ``rate``       | mosquitto's service rate on this box (deliveries per broker CPU-second)   |
| ``run``, ``report`` | the command: JSON, markdown, PNG, the rich table                     |
| ``cli``        | the typer command, registered in :mod:`chaos_bench.cli`                |
| ``clock``, ``errors`` | the daemon's clock seam on simulated time; ``SimError``            |

It lives in the benchmarks' package, which may drive the scheduler and the planners
themselves; ``daemon`` never imports it.
"""

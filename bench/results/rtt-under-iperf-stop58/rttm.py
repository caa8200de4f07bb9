"""Each second, the last RTT echo, the EWMA and the 10-s minimum of netprobe's RttProber to n2
(an echo every 0.2 s); run inside n1's namespace: ``python rttm.py SECONDS``."""

import asyncio
import json
import sys

from netprobe.rtt import RttProber


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


async def main(n: int) -> None:
    prober = RttProber(interval_s=0.2)
    await prober.start()
    prober.add_peer("n2", "10.10.0.2", 6001)
    for i in range(n):
        await asyncio.sleep(1.0)
        s = prober.stats("n2")
        print(json.dumps({"t": i + 1, "last_ms": ms(s.rtt_last_s), "ewma_ms": ms(s.rtt_ewma_s),
                          "min10_ms": ms(s.rtt_min_s)}), flush=True)
    await prober.stop()


asyncio.run(main(int(sys.argv[1])))

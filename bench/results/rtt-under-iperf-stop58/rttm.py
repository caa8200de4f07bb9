import asyncio, json, sys
from netprobe.rtt import RttProber
async def main():
    p = RttProber(interval_s=0.2)
    await p.start()
    p.add_peer("n2", "10.10.0.2", 6001)
    out = []
    for i in range(int(sys.argv[1])):
        await asyncio.sleep(1.0)
        s = p.stats("n2")
        out.append({"t": i + 1, "last_ms": s.rtt_last_s and round(s.rtt_last_s*1e3, 3), "ewma_ms": s.rtt_ewma_s and round(s.rtt_ewma_s*1e3, 3), "min10_ms": s.rtt_min_s and round(s.rtt_min_s*1e3, 3)})
        print(json.dumps(out[-1]), flush=True)
    await p.stop()
asyncio.run(main())

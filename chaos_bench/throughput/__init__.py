"""``chaosctl bench throughput``: steps per second of the same training under torch DDP over
gloo and under Chaos (the ``Trainer`` and the DDP path), one after the other in one run: the
run and report (:mod:`.run`) and the worker every arm runs (:mod:`.worker`)."""

# torch DDP over gloo; the Trainer; the Trainer with overlap=True; chaos_edge.ddp
ARMS = ("ddp", "chaos", "chaos-overlap", "chaos-ddp")
MODELS = ("cnn", "chartf", "dense-25m")

"""``chaosctl bench throughput``: steps per second of the same training under torch DDP over
gloo and under Chaos (the ``Trainer`` and the DDP path), one after the other in one run: the
run and report (:mod:`.run`) and the worker every arm runs (:mod:`.worker`)."""

ARMS = ("ddp", "chaos", "chaos-ddp")  # torch DDP over gloo; the Trainer; chaos_edge.ddp
MODELS = ("cnn", "chartf", "dense-25m")

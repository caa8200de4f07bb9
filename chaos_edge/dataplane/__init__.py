"""The training data plane: authenticated neighbour links and the tree all-reduce.

Runs in the training worker (and the benches), on threads: a reader thread per link, the
caller's thread for a round, helper threads in a :class:`~chaos_edge.dataplane.threads.ThreadSet`
that ``close()`` joins. No asyncio. Layers, bottom up (each module maps to one concern):

- ``errors``: the exception family (:class:`DataPlaneError` and subclasses).
- ``frames``: the binary frame header, size limits, exact reads into buffers.
- ``sockets``: socket tuning and deadline-bounded sends.
- ``auth``: the mutual HMAC-SHA256 handshake.
- ``links``: :class:`PeerLinks`, persistent connections to the neighbours only.
- ``threads``: :class:`ThreadSet`, helper threads joined on close.
- :class:`SyncPolicy` and :func:`spanning_tree` are re-exported from
  :mod:`daemon.contracts.policy`, where the one policy type lives.
- ``rounds`` / ``allreduce``: :class:`AllReducer`, the chunked, pipelined tree all-reduce,
  in layers: ``phases`` (phase state, waits, the agreement), ``pipeline`` (a round's data
  path), ``router`` (received frames), and ``chunkwire`` (each chunk's bytes in the policy's
  wire format, with ``codec``: fp32, fp16, bf16, int8 with error feedback).
- ``fences``: the phases a newer policy makes pointless (``AllReducer.supersede``).
- ``tensors``: flatten/unflatten torch gradients, result digests.

Typical use inside a Trainer::

    links = PeerLinks(node_id, cluster, secret, is_member=membership.__contains__)
    host, port = links.start()
    links.allow(*neighbours_that_will_dial_us)
    links.connect_to(peer, peer_host, peer_port)   # for neighbours we dial
    reducer = AllReducer(links, timeout=30.0)
    flat = flatten_grads(model.parameters())
    try:
        result = reducer.allreduce(flat, samples, step=step, policy=policy)
    except RoundAborted:
        ...  # get the next policy from the scheduler, rerun the same step
    unflatten_into(result.values, list(model.parameters()))
"""

from chaos_edge.dataplane.allreduce import AllReducer, ReduceResult
from chaos_edge.dataplane.conn import LinkConfig
from chaos_edge.dataplane.errors import (
    AuthError,
    DataPlaneError,
    FrameError,
    PeerGone,
    PolicyError,
    RoundAborted,
)
from chaos_edge.dataplane.links import PeerLinks
from chaos_edge.dataplane.rounds import InputFeed
from daemon.contracts.policy import SyncPolicy, TreePlan, spanning_tree

__all__ = [
    "AllReducer",
    "AuthError",
    "DataPlaneError",
    "FrameError",
    "InputFeed",
    "LinkConfig",
    "PeerGone",
    "PeerLinks",
    "PolicyError",
    "ReduceResult",
    "RoundAborted",
    "SyncPolicy",
    "TreePlan",
    "spanning_tree",
]

"""Wire formats: sizes, error bounds, determinism, inf/nan, error feedback, chunked plans."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from chaos_edge.dataplane.chunkwire import Feedback
from chaos_edge.dataplane.codec import INT8_BLOCK, Codec, codec_for
from chaos_edge.dataplane.wireplan import ErrorFeedback, WirePlan
from daemon.contracts.policy import WIRE_FORMATS

pytestmark = pytest.mark.timeout(120)
LOSSY = ("fp16", "bf16", "int8")
SIZES = [0, 1, 3, INT8_BLOCK - 1, INT8_BLOCK, INT8_BLOCK + 1, 3 * INT8_BLOCK + 17]


def roundtrip(codec: Codec, x: np.ndarray) -> tuple[np.ndarray, bytes]:
    wire = bytearray(codec.wire_bytes(x.size))
    codec.encode(x, wire)
    out = np.full(x.size, 7.0, np.float32)  # garbage: decode must overwrite all of it
    codec.decode(wire, out)
    return out, bytes(wire)


def int8_scales(wire: bytes, n: int) -> np.ndarray:
    return np.frombuffer(wire, "<f4", count=-(-n // INT8_BLOCK))


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float32 with round-to-nearest-even on the bits (NaN kept NaN)."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def check_bound(name: str, x: np.ndarray, y: np.ndarray, wire: bytes) -> None:
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    ax = np.abs(x.astype(np.float64))
    if name == "fp32":
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
    elif name == "fp16":  # 11-bit significand; below 2**-14 the step is 2**-24
        assert np.all(err <= np.maximum(ax * 2.0**-11, 2.0**-25))
    elif name == "bf16":  # 8-bit significand, float32's exponent range
        assert np.all(err <= np.maximum(ax * 2.0**-8, 2.0**-134))
    else:
        scales = int8_scales(wire, x.size).astype(np.float64)
        for b, s in enumerate(scales):
            blk = slice(b * INT8_BLOCK, (b + 1) * INT8_BLOCK)
            peak = float(np.max(ax[blk]))
            if peak < 2.0**-100:
                assert s == 0 and np.all(y[blk] == 0)  # sent as zeros
            else:
                assert s == np.float32(np.float32(peak) / np.float32(127))
                assert np.all(err[blk] <= s / 2 * (1 + 1e-4))


@pytest.mark.parametrize("name", WIRE_FORMATS)
@pytest.mark.parametrize("n", SIZES)
def test_wire_sizes_are_exact(name: str, n: int) -> None:
    want = {"fp32": 4 * n, "fp16": 2 * n, "bf16": 2 * n,
            "int8": n + 4 * -(-n // INT8_BLOCK)}[name]
    codec = codec_for(name)
    assert codec.wire_bytes(n) == want and codec.name == name
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    y, wire = roundtrip(codec, x)
    assert len(wire) == want
    check_bound(name, x, y, wire)
    with pytest.raises(ValueError):
        codec.encode(x, bytearray(want + 1))


finite32 = st.floats(-(2.0**100), 2.0**100, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(WIRE_FORMATS),
       st.integers(1, 3 * INT8_BLOCK).flatmap(lambda n: hnp.arrays(np.float32, n,
                                                                   elements=finite32)),
       st.floats(1e-6, 1e6))
def test_round_trip_error_within_the_format_bound(name: str, x: np.ndarray, gain: float) -> None:
    # fp16's range ends at 65504; the others get every magnitude
    x = np.clip(x, -6e4, 6e4) if name == "fp16" else x * np.float32(gain)
    y, wire = roundtrip(codec_for(name), np.ascontiguousarray(x, dtype=np.float32))
    check_bound(name, x.astype(np.float32), y, wire)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.uint32, st.integers(1, 600)))
def test_bf16_rounds_to_nearest_even(bits: np.ndarray) -> None:
    x = bits.view(np.float32)
    y, _ = roundtrip(codec_for("bf16"), x)
    ref = bf16_reference(x)
    assert np.array_equal(np.isnan(y), np.isnan(x))
    ok = ~np.isnan(x)
    assert np.array_equal(y[ok].view(np.uint32), ref[ok].view(np.uint32))


def test_bf16_ties_go_to_even_not_down() -> None:
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 3 * 2**-8), 1 + 2**-8 + 2**-20], np.float32)
    y, _ = roundtrip(codec_for("bf16"), x)
    assert y.tolist() == [1.0, 1 + 2**-6, -(1 + 2**-6), 1 + 2**-7]


@pytest.mark.parametrize("name", WIRE_FORMATS)
def test_encode_and_decode_are_deterministic(name: str) -> None:
    codec = codec_for(name)
    x = (np.random.default_rng(1).standard_normal(3 * INT8_BLOCK + 5) * 3).astype(np.float32)
    y1, w1 = roundtrip(codec, x)
    y2, w2 = roundtrip(codec, x.copy())
    assert w1 == w2 and y1.tobytes() == y2.tobytes()
    acc = np.zeros_like(x)
    codec.decode_add(w1, acc)  # from zeros: the same values
    assert np.array_equal(acc, y1)
    base = np.linspace(-1, 1, x.size, dtype=np.float32)
    acc = base.copy()
    codec.decode_add(np.frombuffer(w1, np.uint8).copy(), acc)
    assert np.array_equal(acc, base + y1)


def test_another_process_decodes_the_same_bits() -> None:
    """A member is another process (here with one torch thread): the same bytes decode to
    the same floats, bit for bit."""
    x = (np.random.default_rng(2).standard_normal(5 * INT8_BLOCK + 3) * 10).astype(np.float32)
    wires, digests = {}, {}
    for name in WIRE_FORMATS:
        y, wires[name] = roundtrip(codec_for(name), x)
        digests[name] = hashlib.sha256(y.tobytes()).hexdigest()
    script = textwrap.dedent("""
        import hashlib, sys, numpy as np, torch
        torch.set_num_threads(1)
        from chaos_edge.dataplane.codec import codec_for
        name, n = sys.argv[1], int(sys.argv[2])
        out = np.empty(n, np.float32)
        codec_for(name).decode(sys.stdin.buffer.read(), out)
        print(hashlib.sha256(out.tobytes()).hexdigest())
    """)
    for name in WIRE_FORMATS:
        proc = subprocess.run([sys.executable, "-c", script, name, str(x.size)],
                              input=wires[name], capture_output=True, timeout=60, check=True)
        assert proc.stdout.decode().strip() == digests[name], name


def test_int8_block_with_inf_or_nan_decodes_non_finite() -> None:
    codec = codec_for("int8")
    x = np.random.default_rng(3).standard_normal(4 * INT8_BLOCK).astype(np.float32)
    x[5] = np.inf
    x[INT8_BLOCK + 9] = np.nan
    x[2 * INT8_BLOCK] = -np.inf
    with np.errstate(all="raise"):
        y, wire = roundtrip(codec, x)
    for b in range(3):
        assert np.all(np.isnan(y[b * INT8_BLOCK : (b + 1) * INT8_BLOCK]))
    assert np.isnan(int8_scales(wire, x.size)[:3]).all()
    scale = float(int8_scales(wire, x.size)[3])  # the clean block is unaffected
    assert np.abs(y[3 * INT8_BLOCK :] - x[3 * INT8_BLOCK :]).max() <= scale / 2 * (1 + 1e-4)
    # the average a GradScaler checks stays non-finite after decode_add
    acc = np.ones_like(x)
    codec.decode_add(wire, acc)
    assert not np.isfinite(acc).all()


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_formats_keep_inf_and_nan(name: str) -> None:
    x = np.array([np.inf, -np.inf, np.nan, 1.5, -0.0], np.float32)
    y, _ = roundtrip(codec_for(name), x)
    assert y[0] == np.inf and y[1] == -np.inf and np.isnan(y[2]) and y[3] == 1.5
    assert y[4] == 0 and np.signbit(y[4])


def test_fp16_overflows_to_inf_like_amp() -> None:
    y, _ = roundtrip(codec_for("fp16"), np.array([7e4, -1e5, 65504.0], np.float32))
    assert y.tolist() == [np.inf, -np.inf, 65504.0]


def test_int8_zero_and_tiny_blocks_are_exact_zeros() -> None:
    codec = codec_for("int8")
    x = np.zeros(3 * INT8_BLOCK, np.float32)
    x[INT8_BLOCK : 2 * INT8_BLOCK] = 1e-35  # below 2**-100: sent as zeros
    x[2 * INT8_BLOCK + 1] = 3.0
    with np.errstate(all="raise"):
        y, wire = roundtrip(codec, x)
    assert int8_scales(wire, x.size).tolist() == [0.0, 0.0, np.float32(3.0) / np.float32(127)]
    assert np.all(y[: 2 * INT8_BLOCK] == 0) and y[2 * INT8_BLOCK + 1] == 3.0
    assert np.count_nonzero(y) == 1


def test_codec_for_knows_every_format_and_only_those() -> None:
    assert [codec_for(n).name for n in WIRE_FORMATS] == list(WIRE_FORMATS)
    assert not codec_for("fp32").lossy and all(codec_for(n).lossy for n in LOSSY)
    with pytest.raises(ValueError, match="fp32, fp16, bf16, int8"):
        codec_for("int4")
    with pytest.raises(ValueError):
        codec_for("fp16").encode(np.zeros(4, np.float64), bytearray(8))


# -- error feedback --------------------------------------------------------------------------
@pytest.mark.parametrize("name", LOSSY)
def test_error_feedback_mean_converges_and_residual_stays_bounded(name: str) -> None:
    codec = codec_for(name)
    rng = np.random.default_rng(4)
    c = (rng.standard_normal(2 * INT8_BLOCK + 100) * 0.01).astype(np.float32)
    c[:50] = 1e-9  # below fp16's resolution: only error feedback gets them through
    ef = ErrorFeedback(codec, c.size)
    wire = bytearray(codec.wire_bytes(c.size))
    total = np.zeros(c.size, np.float64)
    one_round_err = np.abs(roundtrip(codec, c)[0] - c).max()
    rounds = 400
    for t in range(rounds):
        got = np.empty_like(c)
        ef.encode(0, c.size, c, wire, decoded=got, tag=(1, 0, t))
        assert ef.commit((1, 0, t))
        total += got
        # what was sent so far plus the residual is exactly what came in
        assert np.allclose(total + ef.residual, c.astype(np.float64) * (t + 1), rtol=1e-5,
                           atol=1e-9)
        assert np.abs(ef.residual).max() <= 2 * one_round_err + 1e-6
    mean = total / rounds
    assert np.abs(mean - c).max() <= (2 * one_round_err + 1e-6) / rounds * 1.01
    if name == "fp16":  # without feedback these would be lost for good
        assert np.allclose(mean[:50], 1e-9, rtol=0.05)


def test_error_feedback_stage_then_discard_leaves_the_residual_untouched() -> None:
    codec = codec_for("int8")
    x = np.random.default_rng(5).standard_normal(3000).astype(np.float32)
    ef = ErrorFeedback(codec, x.size)
    wire = bytearray(codec.wire_bytes(x.size))
    ef.encode(0, x.size, x, wire, tag="a")
    ef.commit("a")
    before = ef.residual.copy()
    assert np.any(before != 0)
    ef.encode(0, 1000, x[:1000], bytearray(codec.wire_bytes(1000)), tag="b")
    assert ef.staged == "b"
    ef.discard()
    assert ef.staged is None and np.array_equal(ef.residual, before)
    assert not ef.commit("b")  # nothing staged any more
    # a rerun with the same input sends the same bytes: nothing was consumed
    again = bytearray(len(wire))
    ef.encode(0, x.size, x, again, tag="c")
    first = bytearray(len(wire))
    ef.encode(0, x.size, x, first, tag="c")
    assert again == first
    # committing another tag applies nothing; staging under a new tag drops the old one
    assert not ef.commit("other") and np.array_equal(ef.residual, before)
    ef.encode(0, 1000, x[:1000], bytearray(codec.wire_bytes(1000)), tag="d")
    ef.encode(1000, 2000, x[1000:2000], bytearray(codec.wire_bytes(1000)), tag="e")
    assert ef.commit("e")  # only [1000, 2000) changes
    after = ef.residual
    assert np.array_equal(after[:1000], before[:1000])
    assert np.array_equal(after[2000:], before[2000:])
    assert not np.array_equal(after[1000:2000], before[1000:2000])
    with pytest.raises(ValueError):
        after[0] = 1.0  # read-only view


def test_error_feedback_keeps_its_residual_through_an_overflow() -> None:
    codec = codec_for("int8")
    x = np.random.default_rng(6).standard_normal(2 * INT8_BLOCK).astype(np.float32)
    ef = ErrorFeedback(codec, x.size)
    wire = bytearray(codec.wire_bytes(x.size))
    ef.encode(0, x.size, x, wire)
    ef.commit()
    before = ef.residual.copy()
    bad = x.copy()
    bad[3] = np.inf
    ef.encode(0, x.size, bad, wire)
    ef.commit()
    res = ef.residual
    assert np.isfinite(res).all()
    assert np.array_equal(res[:INT8_BLOCK], before[:INT8_BLOCK])  # the overflowed block
    ef.reset()
    assert not ef.residual.any()


# -- chunked plans -----------------------------------------------------------------------
@pytest.mark.parametrize("name", WIRE_FORMATS)
def test_plan_keeps_the_tail_exact_and_chunks_aligned(name: str) -> None:
    codec = codec_for(name)
    size, lossy, chunk = 10_003, 7_001, 4_096
    plan = WirePlan(codec, size, lossy, chunk)
    assert plan.nchunks == 3 and plan.identity == (name == "fp32")
    x = (np.random.default_rng(7).standard_normal(size) * 5).astype(np.float32)
    wire = np.zeros(plan.total_bytes, np.uint8)
    y = np.empty_like(x)
    for i in range(plan.nchunks):
        lo, hi = plan.bounds(i)
        assert plan.offset(i) % 8 == 0
        k = min(max(lossy - lo, 0), hi - lo) if codec.lossy else 0
        head = codec.wire_bytes(k) if k else 0
        assert plan.chunk_bytes(i) == head + (-head % 4 if k < hi - lo else 0) + 4 * (hi - lo - k)
        seg = wire[plan.offset(i) : plan.offset(i) + plan.chunk_bytes(i)]
        plan.encode(i, x[lo:hi], seg)
        plan.decode(i, seg, y[lo:hi])
    assert plan.slot_bytes == max(plan.chunk_bytes(i) for i in range(3))
    assert np.array_equal(y[lossy:], x[lossy:])  # buffers, counters, speed slots: exact
    check_bound(name, x[:4096], y[:4096], bytes(wire[: plan.chunk_bytes(0)]))
    acc = np.ones_like(x)
    for i in range(plan.nchunks):
        lo, hi = plan.bounds(i)
        plan.decode_add(i, wire[plan.offset(i) : plan.offset(i) + plan.chunk_bytes(i)],
                        acc[lo:hi])
    assert np.array_equal(acc, np.float32(1) + y)
    assert WirePlan(codec, size, 0, chunk).identity


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(WIRE_FORMATS), st.integers(0, 9000), st.floats(0, 1),
       st.integers(1, 5000))
def test_any_plan_round_trips_chunk_by_chunk(name: str, size: int, frac: float,
                                             chunk: int) -> None:
    codec, lossy = codec_for(name), int(size * frac)
    plan = WirePlan(codec, size, lossy, chunk)
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    y = np.full(size, np.nan, np.float32)
    wire = np.zeros(plan.total_bytes, np.uint8)
    for i in range(plan.nchunks):
        lo, hi = plan.bounds(i)
        seg = wire[plan.offset(i) : plan.offset(i) + plan.chunk_bytes(i)]
        plan.encode(i, x[lo:hi], seg)
        plan.decode(i, seg, y[lo:hi])
    assert plan.nchunks == -(-size // chunk) and plan.offset(plan.nchunks) == plan.total_bytes
    assert np.array_equal(y[lossy:], x[lossy:]) and not np.isnan(y).any()
    if not codec.lossy or lossy == 0:
        assert plan.identity and np.array_equal(y, x)
    else:
        assert np.abs(y[:lossy] - x[:lossy]).max(initial=0) <= 0.05 * np.abs(x).max()


@pytest.mark.parametrize("name", LOSSY)
def test_a_compressed_tree_round_is_bit_identical_everywhere(name: str) -> None:
    """The all-reduce's data flow on one box: leaves send encoded partial sums up, the root
    adds them, averages, encodes once (its own output is the decode of those bytes), and
    every member decodes the broadcast bytes: all hold the same bits, near the fp32 mean."""
    rng = np.random.default_rng(8)
    size, lossy, chunk = 9_000, 8_990, 2_500
    plan = WirePlan(codec_for(name), size, lossy, chunk)
    grads = {n: rng.standard_normal(size).astype(np.float32) for n in "abc"}
    samples = {"a": 3, "b": 5, "c": 2}
    total = sum(samples.values())
    feedback = {n: ErrorFeedback(plan.codec, lossy) for n in "abc"}
    root, out = "b", {n: np.empty(size, np.float32) for n in "abc"}
    down = np.zeros(plan.total_bytes, np.uint8)
    for i in range(plan.nchunks):
        lo, hi = plan.bounds(i)
        acc = out[root][lo:hi]
        np.multiply(grads[root][lo:hi], np.float32(samples[root]), out=acc)
        for leaf in "ac":
            up = bytearray(plan.chunk_bytes(i))
            plan.encode(i, grads[leaf][lo:hi] * np.float32(samples[leaf]), up,
                        feedback=feedback[leaf], tag=(1, 0, 0))
            plan.decode_add(i, up, acc)
        np.divide(acc, np.float32(total), out=acc)
        seg = down[plan.offset(i) : plan.offset(i) + plan.chunk_bytes(i)]
        plan.encode(i, acc, seg, feedback=feedback[root], decoded=acc, tag=(1, 0, 0))
        for leaf in "ac":
            plan.decode(i, seg, out[leaf][lo:hi])
    assert out["a"].tobytes() == out["b"].tobytes() == out["c"].tobytes()
    exact = sum(grads[n].astype(np.float64) * samples[n] for n in "abc") / total
    err = np.abs(out["a"] - exact)
    tol = {"fp16": 2e-3, "bf16": 2e-2, "int8": 0.1}[name]
    assert err[:lossy].max() <= tol
    assert err[lossy:].max() <= 1e-6


def test_a_round_in_another_format_drops_the_int8_residual() -> None:
    """The policy controller switches the wire mid-run: int8, fp32, then int8 again must
    start from a zero residual, not add back what a round long ago lost."""
    fb = Feedback()
    int8 = WirePlan(codec_for("int8"), 4096, 4096, 1024)
    up, _ = fb.for_plan(int8)
    assert up is not None
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    up.encode(0, 4096, x, np.zeros(int8.codec.wire_bytes(4096), np.uint8), tag=1)
    fb.commit(1)
    assert np.abs(up.residual).max() > 0
    assert fb.for_plan(int8)[0] is up  # the same format: the residual goes on
    assert fb.for_plan(WirePlan(codec_for("fp32"), 4096, 4096, 1024)) == (None, None)
    again, _ = fb.for_plan(int8)
    assert again is not up and not np.abs(again.residual).any()

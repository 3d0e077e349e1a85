"""The wire protocol: round trips, zero copy, and validation of hostile input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from zrl.transport import protocol as P

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

ALLOWED = sorted(P.ALLOWED_DTYPES)
dtypes = st.sampled_from([np.dtype(d) for d in ALLOWED])

# Plain metadata values: what msgpack carries losslessly (no NaN: it is not equal to itself).
meta_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
meta_values = st.recursive(
    meta_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
metas = st.dictionaries(st.text(max_size=10), meta_values, max_size=6)


@st.composite
def named_arrays(draw, min_dims: int = 1):
    names = draw(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=4))
    out = {}
    for name in names:
        dtype = draw(dtypes)
        shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=4, min_side=0, max_side=5))
        out[name] = draw(hnp.arrays(dtype, shape))
    return out


def header(**fields) -> bytes:
    base = {"v": P.PROTOCOL_VERSION, "k": "test", "s": "peer", "q": 0, "st": "", "m": {}, "a": []}
    base.update(fields)
    return msgpack.packb(base, use_bin_type=True)


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()  # bitwise: NaN payloads and -0.0 included


# --- round trip --------------------------------------------------------------------------


@SETTINGS
@given(
    arrays=named_arrays(),
    meta=metas,
    kind=st.text(min_size=1, max_size=12),
    sender=st.text(max_size=12),
    seq=st.integers(0, P.MAX_SEQ),
    stream=st.text(max_size=12),
)
def test_round_trip(arrays, meta, kind, sender, seq, stream):
    msg = P.Message(kind, meta=meta, arrays=arrays, sender=sender, seq=seq, stream=stream)
    frames = P.encode(msg)
    assert len(frames) == 1 + len(arrays)
    # What goes over the wire is bytes; decode from exactly that.
    wire = [bytes(memoryview(f)) for f in frames]
    got = P.decode(wire)
    assert (got.kind, got.sender, got.seq, got.stream) == (kind, sender, seq, stream)
    assert got.version == P.PROTOCOL_VERSION
    assert got.meta == meta
    assert list(got.arrays) == list(arrays)
    for name, arr in arrays.items():
        assert_same_array(got.arrays[name], arr)
    assert got.nbytes == sum(a.nbytes for a in arrays.values())


@SETTINGS
@given(arr=hnp.arrays(dtypes, hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=6)))
def test_round_trip_non_contiguous(arr):
    view = arr.T if arr.ndim == 2 else arr[:, ::2]
    got = P.decode([bytes(memoryview(f)) for f in P.encode(P.Message("x", arrays={"a": view}))])
    assert_same_array(got.arrays["a"], np.ascontiguousarray(view))


@pytest.mark.parametrize("dtype", ["<f8", "|b1", "<u2"])
def test_round_trip_zero_dim(dtype):
    arr = np.array(1, dtype=dtype)
    got = P.decode(P.encode(P.Message("x", arrays={"a": arr})))
    assert_same_array(got.arrays["a"], arr)


def test_numpy_scalars_in_meta_become_plain():
    msg = P.Message(
        "x", meta={"a": np.int64(3), "b": np.float32(0.5), "c": np.arange(3), "d": (1, 2)}
    )
    got = P.decode(P.encode(msg))
    assert got.meta == {"a": 3, "b": 0.5, "c": [0, 1, 2], "d": [1, 2]}
    assert type(got.meta["a"]) is int


def test_encode_rejects_unplain_meta_and_unallowed_dtypes():
    with pytest.raises(TypeError, match="object"):
        P.encode(P.Message("x", meta={"o": object()}))
    for bad in (np.array(["a"]), np.array([1 + 2j]), np.array([1], dtype=">i4"), np.array([None])):
        with pytest.raises(TypeError, match="does not carry"):
            P.encode(P.Message("x", arrays={"a": bad}))


# --- zero copy ---------------------------------------------------------------------------


def test_encode_contiguous_array_is_not_copied():
    arr = np.arange(64, dtype=np.float32).reshape(8, 8)
    frames = P.encode(P.Message("x", arrays={"a": arr, "b": arr[2:4]}))
    assert frames[1] is arr
    assert np.shares_memory(np.asarray(frames[2]), arr)  # a contiguous slice is a view too


def test_decode_from_bytes_is_a_view():
    arr = np.arange(1000, dtype=np.int64)
    frames = [bytes(memoryview(f)) for f in P.encode(P.Message("x", arrays={"a": arr}))]
    got = P.decode(frames).arrays["a"]
    assert np.shares_memory(got, np.frombuffer(frames[1], dtype=np.uint8))
    assert not got.flags.writeable


@pytest.fixture
def pair(zmq_ctx):
    a, b = zmq_ctx.socket(zmq.PAIR), zmq_ctx.socket(zmq.PAIR)
    for s in (a, b):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 2000)
        s.setsockopt(zmq.SNDTIMEO, 2000)
    a.bind("inproc://protocol-test")
    b.connect("inproc://protocol-test")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)


def test_decode_from_zmq_frames_is_a_view(pair):
    a, b = pair
    arr = np.arange(50_000, dtype=np.float64)  # above pyzmq's copy threshold
    a.send_multipart(P.encode(P.Message("x", arrays={"a": arr, "b": arr[:3]})), copy=False)
    frames = b.recv_multipart(copy=False)
    assert all(isinstance(f, zmq.Frame) for f in frames)
    got = P.decode(frames)
    for name, frame in zip(("a", "b"), frames[1:], strict=True):
        assert np.shares_memory(got.arrays[name], np.frombuffer(frame.buffer, dtype=np.uint8))
    np.testing.assert_array_equal(got.arrays["a"], arr)


def test_decoded_frame_arrays_are_read_only(pair):
    a, b = pair
    arr = np.arange(50_000, dtype=np.float64)
    a.send_multipart(P.encode(P.Message("x", arrays={"a": arr})), copy=False)
    got = P.decode(b.recv_multipart(copy=False)).arrays["a"]
    assert not got.flags.writeable


# --- validation --------------------------------------------------------------------------


@SETTINGS
@given(frames=st.lists(st.binary(max_size=64), max_size=5))
def test_garbage_frames_only_raise_protocol_error(frames):
    try:
        P.decode(frames)
    except P.ProtocolError:
        pass


spec_entries = st.lists(
    st.one_of(
        meta_values,
        st.tuples(
            st.one_of(st.text(max_size=3), st.integers(-(2**63), 2**64 - 1), st.none()),
            st.one_of(st.sampled_from([*ALLOWED, "|O", "<U4", "|V8", ">f8", "<c16"]), meta_leaves),
            # Dims are bounded so their product cannot overflow int64 (a separate test, below).
            st.one_of(
                st.lists(st.integers(-3, 2**20) | st.booleans() | st.floats(), max_size=3),
                meta_leaves,
            ),
        ).map(list),
    ),
    max_size=4,
)


@SETTINGS
@given(
    head=st.fixed_dictionaries(
        {},
        optional={
            "v": st.one_of(st.just(P.PROTOCOL_VERSION), meta_leaves),
            "k": meta_leaves,
            "s": meta_leaves,
            "q": meta_leaves,
            "st": meta_leaves,
            "m": meta_values,
            "a": st.one_of(spec_entries, meta_leaves),
        },
    ),
    bodies=st.lists(st.binary(max_size=48), max_size=5),
)
def test_structured_garbage_only_raises_protocol_error(head, bodies):
    """Well-formed msgpack headers with wrong field types, dtypes, shapes and frame counts."""
    frames = [msgpack.packb(head, use_bin_type=True), *bodies]
    try:
        msg = P.decode(frames)
    except P.ProtocolError:
        return
    # Accepted: then it must be consistent with what the header announced.
    assert len(msg.arrays) == len(frames) - 1
    for arr, body in zip(msg.arrays.values(), bodies, strict=True):
        assert arr.nbytes == len(body)


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("<f8", [2**32, 2**32], 0), ("|u1", [2**61 + 1, 8], 8)],
)
def test_shape_product_overflow_is_protocol_error(dtype, shape, nbytes):
    with pytest.raises(P.ProtocolError):
        P.decode([header(a=[["a", dtype, shape]]), b"\0" * nbytes])


def encoded(arr: np.ndarray | None = None) -> list[bytes]:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4) if arr is None else arr
    return [bytes(memoryview(f)) for f in P.encode(P.Message("x", arrays={"a": arr}))]


def test_truncated_extra_and_missing_frames():
    frames = encoded()
    with pytest.raises(P.ProtocolError, match="47 bytes, header says 48"):
        P.decode([frames[0], frames[1][:-1]])
    with pytest.raises(P.ProtocolError, match="49 bytes, header says 48"):
        P.decode([frames[0], frames[1] + b"\0"])
    with pytest.raises(P.ProtocolError, match="announces 1 arrays but 2 frames"):
        P.decode([*frames, b"extra"])
    with pytest.raises(P.ProtocolError, match="announces 1 arrays but 0 frames"):
        P.decode(frames[:1])
    with pytest.raises(P.ProtocolError, match="empty message"):
        P.decode([])


@pytest.mark.parametrize("dtype", ["|O", "<U4", "|V8", ">f8", "<c16", "float32", 7, None])
def test_unallowed_dtype_in_header(dtype):
    with pytest.raises(P.ProtocolError, match="not allowed"):
        P.decode([header(a=[["a", dtype, [1]]]), b"\0" * 8])


@pytest.mark.parametrize(
    "shape", [[-1], [1.5], [True], "3", None, [1] * (P.MAX_NDIM + 1), [2, None]]
)
def test_bad_shapes(shape):
    with pytest.raises(P.ProtocolError, match="bad shape"):
        P.decode([header(a=[["a", "<f4", shape]]), b"\0" * 4])


@pytest.mark.parametrize("shape", [[2**40], [2**20, 2**20], [2**63], [2**64 - 1]])
def test_huge_shapes_do_not_allocate(shape):
    with pytest.raises(P.ProtocolError, match="header says"):
        P.decode([header(a=[["a", "<f4", shape]]), b"\0" * 4])


def test_size_cap():
    frames = encoded(np.zeros(1000, dtype=np.uint8))
    with pytest.raises(P.ProtocolError, match="size cap of 500"):
        P.decode(frames, max_bytes=500)
    assert P.decode(frames, max_bytes=len(frames[0]) + 1000).arrays["a"].size == 1000
    with pytest.raises(P.ProtocolError, match="size cap"):
        P.decode(frames, max_bytes=len(frames[0]) + 999)


def test_header_limits_and_type():
    with pytest.raises(P.ProtocolError, match="exceeds"):
        P.decode([b"\xc0" * (P.MAX_HEADER_BYTES + 1)])
    with pytest.raises(P.ProtocolError, match="not msgpack"):
        P.decode([b"\xc1"])
    with pytest.raises(P.ProtocolError, match="not msgpack"):
        P.decode([msgpack.packb({1: 2})])  # non-string map keys
    for value in ([1, 2], 3, "hello", None):
        with pytest.raises(P.ProtocolError, match="not a map"):
            P.decode([msgpack.packb(value)])


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"k": ""}, "no kind"),
        ({"k": 3}, "no kind"),
        ({"s": 3}, "must be strings"),
        ({"st": b"x"}, "must be strings"),
        ({"q": -1}, "bad sequence"),
        ({"q": True}, "bad sequence"),
        ({"q": 1.0}, "bad sequence"),
        ({"q": P.MAX_SEQ + 1}, "bad sequence"),
        ({"q": 2**64 - 1}, "bad sequence"),
        ({"s": "a" * (P.MAX_NAME_CHARS + 1)}, "longer than"),
        ({"st": "a" * (P.MAX_NAME_CHARS + 1)}, "longer than"),
        ({"m": [1]}, "metadata is not a map"),
        ({"a": {}}, "array list"),
        ({"a": [[]] * (P.MAX_ARRAYS + 1)}, "array list"),
        ({"a": [["a", "<f4"]]}, r"not \[name, dtype, shape\]"),
        ({"a": [[1, "<f4", [1]]]}, "bad or duplicate array name"),
    ],
)
def test_bad_header_fields(fields, match):
    n = len(fields["a"]) if isinstance(fields.get("a"), list) else 0
    with pytest.raises(P.ProtocolError, match=match):
        P.decode([header(**fields), *[b"\0" * 4] * n])


def test_duplicate_array_names():
    spec = [["a", "<f4", [1]], ["a", "<f4", [1]]]
    with pytest.raises(P.ProtocolError, match="duplicate"):
        P.decode([header(a=spec), b"\0" * 4, b"\0" * 4])


@pytest.mark.parametrize("theirs", [2, 0, None, "1"])
def test_version_mismatch_names_both_versions(theirs):
    head = msgpack.packb({"k": "x"} if theirs is None else {"k": "x", "v": theirs})
    with pytest.raises(P.VersionMismatch) as info:
        P.decode([head])
    text = str(info.value)
    assert f"peer speaks {theirs!r}" in text
    assert f"this zrl speaks {P.PROTOCOL_VERSION}" in text
    assert info.value.theirs == theirs
    assert isinstance(info.value, P.ProtocolError)


def test_peek_sender():
    assert P.peek_sender([header(s="alice", v=99)]) == "alice"
    assert P.peek_sender([b"\xc1garbage"]) == "?"
    assert P.peek_sender([msgpack.packb([1])]) == "?"
    assert P.peek_sender([header(s=5)]) == "?"


# --- require_meta -------------------------------------------------------------------


def make_msg() -> P.Message:
    return P.Message(
        "trajectory",
        sender="actor-0",
        meta={"n": 3, "x": 0.5, "flag": True, "name": "a"},
        arrays={"obs": np.zeros((2, 3), np.float32), "act": np.zeros(2, np.int64)},
    )


def test_require_meta():
    msg = make_msg()
    P.require_meta(msg, {"n": int, "x": (int, float), "flag": bool, "name": str})
    with pytest.raises(P.ProtocolError, match="field 'missing' is None"):
        P.require_meta(msg, {"missing": int})
    with pytest.raises(P.ProtocolError, match="field 'name' is 'a'"):
        P.require_meta(msg, {"name": int})
    with pytest.raises(P.ProtocolError, match="field 'flag' is True"):
        P.require_meta(msg, {"flag": int})  # a bool is not an int here
    with pytest.raises(P.ProtocolError, match="field 'flag'"):
        P.require_meta(msg, {"flag": float})


def test_plain_meta_is_always_encodable():
    class Odd:
        pass

    meta = {
        "huge": 2**70,
        "neg": -(2**70),
        "np": np.int64(3),
        "f": np.float32(0.5),
        "t": (1, 2),
        1: "int key",
        "odd": Odd(),
        "deep": [[[[[[[[[[1]]]]]]]]]],
    }
    with pytest.raises((OverflowError, TypeError)):
        P.encode(P.Message("x", meta={"huge": 2**70}))
    got = P.decode(P.encode(P.Message("x", meta=P.plain_meta(meta)))).meta
    assert got["huge"] == 2**64 - 1 and got["neg"] == -(2**63)
    assert (got["np"], got["f"], got["t"], got["1"]) == (3, 0.5, [1, 2], "int key")
    assert got["odd"].startswith("<")
    assert P.saturate(2**80) == P.COUNTER_MAX and P.saturate(-5) == 0


def test_encoded_arrays_reach_zmq_without_a_copy(pair):
    """encode() hands zmq numpy's own buffer (send copy=False): over inproc, where libzmq
    passes the message itself, the receiver's frame is the sender's array memory, and
    decode() gives a read-only view of it. No byte is copied from producer to consumer."""
    a, b = pair
    arr = np.arange(2**20, dtype=np.uint8)
    a.send_multipart(P.encode(P.Message("x", arrays={"obs": arr})), copy=False)
    frames = b.recv_multipart(copy=False)
    assert np.shares_memory(np.frombuffer(frames[1].buffer, dtype=np.uint8), arr)
    got = P.decode(frames).arrays["obs"]
    assert np.shares_memory(got, arr)
    assert not got.flags.writeable

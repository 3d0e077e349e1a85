"""The message schemas: ``validate`` accepts what the roles send and names what is wrong, and
every kind of the protocol is documented (module docstring and ``docs/protocol.md``)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import ANY, Schema, validate

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
SIZES = {"E": 2, "T": 3, "O": 4, "A": 2, "B": 5, "N": 6, "S": 7, "P": 4, "R": 8}


def good_arrays(schema: Schema, **sizes: int) -> dict[str, np.ndarray]:
    """Arrays that fit ``schema`` with the dims of ``SIZES`` (overridden by ``sizes``)."""
    dims = {**SIZES, **sizes}
    rng = np.random.default_rng(0)
    out = {}
    for name, spec in schema.arrays.items():
        shape = tuple(dims.get(d, 1) for d in spec.dims)
        out[name] = rng.uniform(0, 1, shape).astype((spec.dtypes or ("float32",))[0])
    return out


def message(schema: Schema, arrays: dict[str, np.ndarray], kind: str | None = None) -> P.Message:
    return P.Message(kind or schema.kind, arrays=arrays, sender="peer-0")


def roundtrip(msg: P.Message) -> P.Message:
    """What a receiver sees: decoded frames, read-only views."""
    return P.decode([bytes(memoryview(f)) for f in P.encode(msg)])


SCHEMAS = list(M.SCHEMAS)


def test_schemas_are_the_module_constants():
    constants = {v.name: v for k, v in vars(M).items() if k.isupper() and isinstance(v, Schema)}
    assert constants == M.SCHEMAS
    assert set(M.SCHEMAS) == {
        "transitions",
        "frame_transitions",
        "continuous_transitions",
        "unroll",
        "transition_batch",
        "continuous_transition_batch",
        "unroll_batch",
        "continuous_unroll",
        "turn_unroll",
        "search_samples",
        "continuous_unroll_batch",
        "frame_unroll",
        "frame_unroll_batch",
        "sequences",
        "sequence_batch",
        "frame_sequences",
        "frame_sequence_batch",
        "recurrent_unroll",
        "recurrent_unroll_batch",
        "recurrent_frame_unroll",
        "recurrent_frame_unroll_batch",
        "priorities",
        "infer_obs",
        "infer_step",
    }
    for schema in M.SCHEMAS.values():
        assert schema.kind in P.KINDS
        assert schema.doc and "\n" not in schema.doc
        for spec in schema.arrays.values():
            assert all(np.dtype(name).str in P.ALLOWED_DTYPES for name in spec.dtypes)
            assert spec.dims and all(d == ANY or d in SIZES for d in spec.dims)
            assert not spec.finite or any(np.dtype(n).kind == "f" for n in spec.dtypes)


def test_experience_schemas_are_their_options():
    """Each experience schema is the one ``experience_schema`` gives for the options its name
    spells, and its arrays are the plain item's changed by those options only."""
    found = {}
    for item, batch, frames, recurrent, continuous, turns in itertools.product(
        ("transitions", "unroll", "sequences"), *[(False, True)] * 5
    ):
        options = dict(frames=frames, recurrent=recurrent, continuous=continuous, turns=turns)
        try:
            schema = M.experience_schema(item, batch=batch, **options)
        except ValueError as exc:
            assert str(exc).startswith(f"no {item} ")
            continue
        spelled = [
            word
            for word, on in zip(
                ("recurrent", "turn", "frame", "continuous"),
                (recurrent, turns, frames, continuous),
                strict=True,
            )
            if on
        ]
        noun = f"{item.removesuffix('s')}_batch" if batch else item
        assert schema.name == "_".join([*spelled, noun])
        assert schema.kind == (P.BATCH if batch else P.TRAJECTORY)
        plain = M.experience_schema(item, batch=batch)
        assert ("frames" in schema.arrays) == frames and ("obs" in schema.arrays) != frames
        assert ("passes" in schema.arrays) == turns
        if item == "unroll":
            assert ("state" in schema.arrays) == recurrent
        action = schema.arrays["action"]
        assert (action.dtype, "A" in action.dims) == (
            ("float32", True) if continuous else (plain.arrays["action"].dtype, False)
        )
        found[schema.name] = schema
    # Every experience schema but alphazero's, which is no variant of the three items.
    experience = {n: s for n, s in M.SCHEMAS.items() if s.kind in (P.TRAJECTORY, P.BATCH)}
    assert found == {n: s for n, s in experience.items() if s is not M.SEARCH_SAMPLES}
    with pytest.raises(ValueError, match="no unroll trajectory schema with frames and continuous"):
        M.experience_schema("unroll", frames=True, continuous=True)
    with pytest.raises(ValueError, match="no transitions batch schema with frames"):
        M.experience_schema("transitions", batch=True, frames=True)


@pytest.mark.parametrize("name", SCHEMAS)
def test_accepts_a_good_message_of_every_schema(name):
    schema = M.SCHEMAS[name]
    used = {d for a in schema.arrays.values() for d in a.dims}
    want: dict[str, Any] = {d: n for d, n in SIZES.items() if d in used}
    if M.OBS in want:
        want[M.OBS] = (want[M.OBS],)  # the observation dim is a shape
    msg = message(schema, good_arrays(schema))
    assert validate(msg, schema) == want
    assert validate(roundtrip(msg), schema) == want  # decoded dtypes are '<f4' etc.
    assert validate(msg, schema, **want) == want
    # Empty batches and zero-length trajectories are well-formed too.
    empty = {d: 0 for d in ("E", "B", "N")}
    assert validate(message(schema, good_arrays(schema, **empty)), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_rejects_a_missing_array(name):
    schema = M.SCHEMAS[name]
    for missing in schema.arrays:
        arrays = good_arrays(schema)
        del arrays[missing]
        with pytest.raises(P.ProtocolError, match=f"lacks array '{missing}'"):
            validate(message(schema, arrays), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_rejects_an_extra_array(name):
    schema = M.SCHEMAS[name]
    arrays = {**good_arrays(schema), "smuggled": np.zeros(3, np.float32)}
    with pytest.raises(P.ProtocolError, match="unexpected array 'smuggled'"):
        validate(message(schema, arrays), schema)


def test_rejects_another_kind():
    for schema in M.SCHEMAS.values():
        other = P.BATCH if schema.kind != P.BATCH else P.TRAJECTORY
        with pytest.raises(P.ProtocolError, match=f"kind '{other}', expected '{schema.kind}'"):
            validate(message(schema, good_arrays(schema), kind=other), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_rejects_a_wrong_dtype(name):
    schema = M.SCHEMAS[name]
    for array, spec in schema.arrays.items():
        wrong = "float64" if "float64" not in spec.dtypes else "float32"
        arrays = good_arrays(schema)
        arrays[array] = arrays[array].astype(wrong)
        with pytest.raises(
            P.ProtocolError, match=f"'{array}' has dtype {wrong}, expected {spec.dtype_text}"
        ):
            validate(message(schema, arrays), schema)


@pytest.mark.parametrize("name", SCHEMAS)
def test_rejects_a_wrong_rank(name):
    schema = M.SCHEMAS[name]
    for array, spec in schema.arrays.items():
        n = len(spec.dims)
        good = good_arrays(schema)[array]
        # An observation may have more axes (an image), never fewer than its dims.
        variadic = spec.dims[-1] == M.OBS
        expected = f"at least {n}" if variadic else str(n)
        for bad in [np.asarray(good[0])] + ([] if variadic else [good[..., None]]):
            arrays = {**good_arrays(schema), array: bad}
            with pytest.raises(
                P.ProtocolError, match=f"'{array}' has rank {bad.ndim}, expected {expected}"
            ):
                validate(message(schema, arrays), schema)


def image_arrays(schema: Schema, shape: tuple[int, ...] = (4, 8, 8)) -> dict[str, np.ndarray]:
    """``good_arrays`` with uint8 image observations of ``shape``."""
    arrays = good_arrays(schema)
    for name, spec in schema.arrays.items():
        if spec.dims[-1] == M.OBS:
            lead = arrays[name].shape[:-1]
            arrays[name] = np.zeros((*lead, *shape), np.uint8)
    return arrays


@pytest.mark.parametrize("name", ["transitions", "unroll", "transition_batch", "unroll_batch"])
def test_uint8_image_observations_pass_with_their_shape(name):
    schema = M.SCHEMAS[name]
    sizes = validate(roundtrip(message(schema, image_arrays(schema))), schema, O=(4, 8, 8))
    assert sizes["O"] == (4, 8, 8)
    with pytest.raises(P.ProtocolError, match=r"dim O must be \(4, 84, 84\), not \(4, 8, 8\)"):
        validate(message(schema, image_arrays(schema)), schema, O=(4, 84, 84))
    arrays = image_arrays(schema)
    first = next(n for n, s in schema.arrays.items() if s.dims[-1] == M.OBS)
    arrays[first] = arrays[first].astype(np.int16)
    with pytest.raises(P.ProtocolError, match="expected float32 or uint8"):
        validate(message(schema, arrays), schema)


def test_the_obs_shape_and_dtype_of_a_space():
    image = SimpleNamespace(shape=(4, 84, 84), dtype=np.dtype(np.uint8))
    vector = SimpleNamespace(shape=(2, 3), dtype=np.dtype(np.float64))
    assert M.obs_shape(image) == (4, 84, 84) and M.obs_dtype(image) == np.uint8
    assert M.obs_shape(vector) == (6,) and M.obs_dtype(vector) == np.float32
    frames = np.ones((2, 4, 84, 84), np.uint8)
    assert M.as_obs(frames, 2, np.dtype(np.uint8)) is frames  # no copy, no float
    assert M.as_obs(np.ones((2, 2, 3)), 2, np.dtype(np.float32)).shape == (2, 6)


@pytest.mark.parametrize("name", SCHEMAS)
def test_rejects_an_inconsistent_dim_naming_the_odd_array(name):
    schema = M.SCHEMAS[name]
    for array, spec in schema.arrays.items():
        for axis, dim in enumerate(spec.dims):
            users = [a for a, s in schema.arrays.items() if dim in s.dims]
            if len(users) < 3:  # with two arrays, the first one's size wins the tie
                continue
            arrays = good_arrays(schema)
            shape = list(arrays[array].shape)
            shape[axis] += 1
            arrays[array] = np.zeros(shape, arrays[array].dtype)
            with pytest.raises(P.ProtocolError, match=f"'{array}' has shape") as err:
                validate(message(schema, arrays), schema)
            assert f"dim {dim}: {SIZES[dim]} vs {SIZES[dim] + 1}" in str(err.value)


def test_an_inconsistent_dim_of_two_arrays_blames_the_second():
    arrays = good_arrays(M.TRANSITIONS)
    arrays["next_obs"] = np.zeros((2, 3, 5), np.float32)
    with pytest.raises(P.ProtocolError) as err:
        validate(message(M.TRANSITIONS, arrays), M.TRANSITIONS)
    msg = str(err.value)
    assert "'next_obs' has shape (2, 3, 5), expected (E=2, T=3, O=4)" in msg
    assert "obs and next_obs widths differ (dim O: 4 vs 5)" in msg
    arrays = good_arrays(M.UNROLL)
    arrays["bootstrap_obs"] = np.zeros((2, 7), np.float32)
    with pytest.raises(P.ProtocolError, match="obs and bootstrap_obs widths differ"):
        validate(message(M.UNROLL, arrays), M.UNROLL)
    arrays = {"key": np.arange(6), "priority": np.ones(5, np.float32)}
    with pytest.raises(P.ProtocolError, match="'priority' has shape .* key and priority lengths"):
        validate(message(M.PRIORITIES, arrays), M.PRIORITIES)


def test_rejects_a_wrong_given_size():
    for schema in M.SCHEMAS.values():
        for array, spec in schema.arrays.items():
            for dim in set(spec.dims) - {ANY}:
                first = next(a for a, s in schema.arrays.items() if dim in s.dims)
                if first != array:
                    continue
                bad = SIZES[dim] + 1
                with pytest.raises(P.ProtocolError) as err:
                    validate(message(schema, good_arrays(schema)), schema, **{dim: bad})
                assert f"'{array}' has shape" in str(err.value)
                assert f"dim {dim} must be {bad}, not {SIZES[dim]}" in str(err.value)
    # A size that is right passes, and a dim the schema does not have is a caller's bug.
    validate(message(M.TRANSITION_BATCH, good_arrays(M.TRANSITION_BATCH)), M.TRANSITION_BATCH, O=4)
    with pytest.raises(TypeError, match="no dims"):
        validate(message(M.TRANSITIONS, good_arrays(M.TRANSITIONS)), M.TRANSITIONS, A=2)


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_rejects_non_finite_values_where_finite(name, value):
    schema = M.SCHEMAS[name]
    for array, spec in schema.arrays.items():
        arrays = good_arrays(schema)
        if arrays[array].dtype.kind != "f":
            continue
        bad = arrays[array].copy()
        bad.flat[-1] = value
        arrays[array] = bad
        msg = message(schema, arrays)
        if spec.finite:
            with pytest.raises(P.ProtocolError, match=f"'{array}' holds NaN or inf") as err:
                validate(msg, schema)
            assert f"at {[n - 1 for n in bad.shape]}" in str(err.value)
        else:
            validate(msg, schema)  # e.g. an unroll batch's importance weights


def test_finiteness_as_the_receivers_check_it():
    finite = {
        name: {a for a, s in sch.arrays.items() if s.finite} for name, sch in M.SCHEMAS.items()
    }
    assert finite == {
        "transitions": {"obs", "reward", "next_obs", "priority"},
        "frame_transitions": {"reward", "priority"},
        "continuous_transitions": {"obs", "action", "reward", "next_obs", "priority"},
        "unroll": {"obs", "logp", "reward", "bootstrap_obs"},
        "transition_batch": {"obs", "reward", "discount", "next_obs", "weight"},
        "continuous_transition_batch": {
            "obs",
            "action",
            "reward",
            "discount",
            "next_obs",
            "weight",
        },
        "sequences": {"obs", "reward", "state", "priority"},
        "sequence_batch": {"obs", "reward", "state", "weight"},
        "recurrent_unroll": {"obs", "logp", "reward", "bootstrap_obs", "state"},
        "unroll_batch": {"obs", "logp", "reward", "bootstrap_obs"},
        "continuous_unroll": {"obs", "action", "logp", "reward", "bootstrap_obs"},
        "continuous_unroll_batch": {"obs", "action", "logp", "reward", "bootstrap_obs"},
        "turn_unroll": {"obs", "logp", "reward", "bootstrap_obs"},
        "frame_unroll": {"logp", "reward"},
        "frame_unroll_batch": {"logp", "reward"},
        "recurrent_unroll_batch": {"obs", "logp", "reward", "bootstrap_obs", "state"},
        "recurrent_frame_unroll": {"logp", "reward", "state"},
        "recurrent_frame_unroll_batch": {"logp", "reward", "state"},
        "frame_sequences": {"reward", "state", "priority"},
        "frame_sequence_batch": {"reward", "state", "weight"},
        "priorities": {"priority"},
        "infer_obs": {"obs"},
        "infer_step": {"obs", "state"},
        "search_samples": {"obs", "policy", "value"},
    }


# --- what the roles send ---------------------------------------------------------------------


def test_replay_batches_fit_the_batch_schemas():
    """``ReplayServer.sample_batch`` over the items ``assemble_*`` stores: exactly the arrays
    of the batch schema a learner validates against, each item's ``weights_version`` that of
    the trajectory (or sequence) it came from."""
    from zrl.replay.assemble import assemble_sequences, assemble_transitions, assemble_unrolls
    from zrl.replay.tables import make_table
    from zrl.roles.replay import ReplayServer

    cases: list[tuple[Schema, Schema, Any]] = [
        (M.TRANSITIONS, M.TRANSITION_BATCH, lambda m: assemble_transitions(m, 3, 0.9)[0]),
        (
            M.CONTINUOUS_TRANSITIONS,
            M.CONTINUOUS_TRANSITION_BATCH,
            lambda m: assemble_transitions(m, 3, 0.9, continuous=True)[0],
        ),
        (M.UNROLL, M.UNROLL_BATCH, assemble_unrolls),
        (
            M.CONTINUOUS_UNROLL,
            M.CONTINUOUS_UNROLL_BATCH,
            lambda m: assemble_unrolls(m, M.CONTINUOUS_UNROLL),
        ),
        (
            M.RECURRENT_UNROLL,
            M.RECURRENT_UNROLL_BATCH,
            lambda m: assemble_unrolls(m, M.RECURRENT_UNROLL),
        ),
        (M.FRAME_UNROLL, M.FRAME_UNROLL_BATCH, lambda m: assemble_unrolls(m, M.FRAME_UNROLL)),
        (
            M.RECURRENT_FRAME_UNROLL,
            M.RECURRENT_FRAME_UNROLL_BATCH,
            lambda m: assemble_unrolls(m, M.RECURRENT_FRAME_UNROLL),
        ),
        (M.SEQUENCES, M.SEQUENCE_BATCH, lambda m: assemble_sequences(m)[0]),
        (
            M.FRAME_SEQUENCES,
            M.FRAME_SEQUENCE_BATCH,
            lambda m: assemble_sequences(m, M.FRAME_SEQUENCES)[0],
        ),
    ]
    for trajectory, batch, assemble in cases:
        arrays = good_arrays(trajectory)  # sequences: P = T + 1 already
        if trajectory in (M.SEQUENCES, M.FRAME_SEQUENCES):
            arrays["weights_version"] = np.full(SIZES["E"], 3, np.int64)  # per sequence
        if "action" in arrays and arrays["action"].dtype == np.int64:
            arrays["action"] = np.ones_like(arrays["action"])
        for flag in ("terminated", "truncated"):
            if flag in arrays:
                arrays[flag] = np.zeros_like(arrays[flag])
        if "valid" in arrays:
            arrays["valid"] = np.ones_like(arrays["valid"])
        msg = P.Message(P.TRAJECTORY, meta={"weights_version": 3}, arrays=arrays, sender="a")
        validate(msg, trajectory)
        for table_kind in ("uniform", "prioritized", "fifo"):
            table = make_table(table_kind, 64)
            table.insert(assemble(msg))
            shard = SimpleNamespace(
                config=SimpleNamespace(replay=SimpleNamespace(batch_size=2)),
                table=table,
                limiter=SimpleNamespace(on_sample=lambda n: None),
                rng=np.random.default_rng(0),
                id="replay-0",
            )
            sampled = ReplayServer.sample_batch(shard)  # type: ignore[arg-type]
            sizes = validate(roundtrip(sampled), batch, O=SIZES["O"])
            assert sizes["B"] == 2
            assert sampled.arrays["weights_version"].tolist() == [3, 3], batch.name
    # A trajectory of transitions without a version: its items' is unknown.
    arrays = good_arrays(M.TRANSITIONS)
    items, _ = assemble_transitions(P.Message(P.TRAJECTORY, arrays=arrays, sender="a"), 3, 0.9)
    assert set(items["weights_version"].tolist()) == {M.UNKNOWN_VERSION}


@pytest.mark.parametrize(
    ("meta", "required", "expected"),
    [
        ({"weights_version": 0}, True, 0),
        ({"weights_version": 12}, False, 12),
        ({}, False, M.UNKNOWN_VERSION),
        ({}, True, "is not an int"),
        ({"weights_version": -1}, False, "is not an int"),
        ({"weights_version": True}, False, "is not an int"),
        ({"weights_version": 1.0}, False, "is not an int"),
        ({"weights_version": M.MAX_VERSION + 1}, False, "is not an int"),
    ],
)
def test_trajectory_version(meta, required, expected):
    if isinstance(expected, int):
        assert M.trajectory_version(meta, required) == expected
    else:
        with pytest.raises(P.ProtocolError, match=expected):
            M.trajectory_version(meta, required)


# --- a replay shard's incarnation -----------------------------------------------------------


def test_a_new_incarnation_is_one_incarnation_accepts():
    values = {M.new_incarnation() for _ in range(64)}
    assert len(values) == 64  # random: a restart never reuses one
    for v in values:
        assert M.incarnation({"incarnation": v}) == v
    assert M.incarnation({"incarnation": 0}) == 0
    assert M.incarnation({"incarnation": 2**63 - 1}) == 2**63 - 1


@pytest.mark.parametrize("value", [None, True, False, -1, 2**63, 1.0, "7", [7], {"a": 1}])
def test_a_malformed_incarnation_is_a_protocol_error(value):
    with pytest.raises(P.ProtocolError, match="incarnation"):
        M.incarnation({"incarnation": value})
    with pytest.raises(P.ProtocolError, match="incarnation"):
        M.incarnation({})


def test_an_incarnation_survives_the_wire():
    meta = {"seq": 3, "inserted": 9, "incarnation": 2**63 - 1}
    msg = P.decode(P.encode(P.Message(P.ACK, meta=meta, sender="replay-0")))
    assert M.incarnation(msg.meta) == 2**63 - 1


# --- every kind is in KINDS, the module docstring and docs/protocol.md ----------------------


def protocol_string_constants() -> dict[str, str]:
    return {
        k: v for k, v in vars(P).items() if isinstance(v, str) and re.fullmatch(r"[A-Z][A-Z_]*", k)
    }


def test_every_kind_constant_is_in_kinds():
    constants = protocol_string_constants()
    topics = {k for k in constants if k.endswith("_TOPIC")}
    # Every other str constant of protocol.py is a message kind: a new constant must be either
    # a topic (``*_TOPIC``) or a kind listed in KINDS.
    kinds = {k: v for k, v in constants.items() if k not in topics}
    assert set(kinds.values()) == set(P.KINDS), (
        f"protocol.KINDS misses {sorted(set(kinds.values()) - set(P.KINDS))}, "
        f"or lists non-constants {sorted(set(P.KINDS) - set(kinds.values()))}"
    )
    assert len(P.KINDS) == len(set(P.KINDS)) == len(kinds), "two constants name one kind"
    assert all(k.lower() == v for k, v in kinds.items()), "kind constants are their lower-case"


def test_every_kind_is_in_the_module_docstring():
    doc = M.__doc__ or ""
    missing = [k for k in P.KINDS if f"``{k}``" not in doc]
    assert not missing, f"zrl/transport/messages.py docstring does not describe {missing}"
    for name in M.SCHEMAS:
        assert f":data:`{name.upper()}`" in doc, name


def test_every_kind_is_in_docs_protocol_md():
    text = DOC.read_text()
    missing = [k for k in P.KINDS if f"`{k}`" not in text]
    assert not missing, f"docs/protocol.md does not describe the kinds {missing}"


def schema_table() -> str:
    """The table of array schemas that docs/protocol.md must contain, as rendered here."""
    rows = [
        "| schema | kind | arrays (dtype [dims], finite: NaN/inf rejected) | sent |",
        "|--------|------|--------------------------------------------------|------|",
    ]
    for schema in M.SCHEMAS.values():
        arrays = ", ".join(
            f"`{name}` {spec.dtype_text} [{', '.join(spec.dims)}]"
            + (" finite" if spec.finite else "")
            for name, spec in schema.arrays.items()
        )
        rows.append(f"| `{schema.name}` | `{schema.kind}` | {arrays} | {schema.doc} |")
    return "\n".join(rows) + "\n"


def test_docs_list_the_array_schemas():
    table = schema_table()
    assert table in DOC.read_text(), (
        "docs/protocol.md's table of array schemas is not the one zrl.transport.messages "
        f"defines; it should read:\n{table}"
    )

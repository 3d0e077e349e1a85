"""Policies that leave zrl: a model as one ONNX or TorchScript file that needs neither zrl nor
its model builder, and the same policy's outputs from zrl's own forward to compare it with.

An exported policy is greedy and self-contained: it takes observations as the env gives them
(``uint8`` frames or ``float32`` vectors) and does what zrl's encoders do to them inside the
file (``uint8`` scaled by 1/255; ``model.normalize_input``'s running statistics, frozen at
export). Its inputs and outputs, by name (the ONNX graph's names; a TorchScript module takes
the inputs positionally and returns the outputs as a tuple in this order):

==============  =============================  ===================================================
name            shape, dtype                   what
==============  =============================  ===================================================
``obs``         ``[B, *obs_shape]``            observations (a multi-agent slot's carries its
                                               action mask: the model reads it from there)
``state``       ``[B, S]`` float32             recurrent models (``model.core``) only: the state
                                               after the previous step, zeros at an episode's start
``action``      ``[B]`` int64 or               the greedy action: argmax of the Q-values or
                ``[B, act_dim]`` float32       logits; a continuous policy's deterministic action
                                               clipped to the action space's bounds
``q_values``    ``[B, A]`` float32             Q-networks (apex_dqn, r2d2)
``logits``      ``[B, A]`` float32             actor-critics (ppo, impala, appo, a3c)
``value``       ``[B]`` float32                actor-critics (the Gaussian one too)
``next_state``  ``[B, S]`` float32             recurrent models: the state to pass at the next step
==============  =============================  ===================================================

The batch size ``B`` is free in both formats. The ONNX file comes from torch's TorchScript-based
exporter (``dynamo=False``: the dynamo exporter needs onnxscript), opset ``ONNX_OPSET``; the
signature is also in its metadata (``zrl.signature``, JSON), and in a TorchScript file's
extra file ``zrl.json``. onnx and onnxruntime are an optional extra (``EXPORT_INSTALL``).
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from zrl.nets.continuous import clip_to_bounds
from zrl.nets.discrete import greedy_actions
from zrl.nets.encoders import InputNormalizer, image_encoders
from zrl.nets.recurrent import greedy_step, is_recurrent
from zrl.transport.messages import obs_dtype

Format = Literal["onnx", "torchscript"]
FORMATS: tuple[Format, ...] = ("onnx", "torchscript")
SUFFIXES: dict[Format, str] = {"onnx": ".onnx", "torchscript": ".torchscript.pt"}
"""The file name endings ``zrl export`` gives each format (and reads the format back from)."""
EXPORT_INSTALL = 'pip install -e ".[export]"'
ONNX_OPSET = 17
SIGNATURE_KEY = "zrl.signature"
TORCHSCRIPT_EXTRA = "zrl.json"


@dataclass(frozen=True)
class Signature:
    """What an exported policy takes and gives (the names of the module docstring's table)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    obs_shape: tuple[int, ...]
    obs_dtype: str
    state_size: int = 0
    """``S``: the width of ``state`` and ``next_state`` (0: a feed-forward policy)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Signature:
        raw = json.loads(text)
        return cls(
            inputs=tuple(raw["inputs"]),
            outputs=tuple(raw["outputs"]),
            obs_shape=tuple(raw["obs_shape"]),
            obs_dtype=str(raw["obs_dtype"]),
            state_size=int(raw.get("state_size", 0)),
        )


class FrozenNormalizer(nn.Module):
    """An :class:`InputNormalizer` with its statistics frozen, computed out of place (the
    exporters cannot write into an ``out=`` tensor): the same ``x * scale`` normalized, the
    same float32 operations in the same order."""

    mean: Tensor
    var: Tensor

    def __init__(self, normalizer: InputNormalizer) -> None:
        super().__init__()
        self.eps, self.clip = normalizer.eps, normalizer.clip
        self.register_buffer("mean", normalizer.mean.detach().clone())
        self.register_buffer("var", normalizer.var.detach().clone())

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        inv_std = torch.rsqrt(self.var + self.eps)
        a, b = inv_std * scale, -self.mean * inv_std
        return torch.addcmul(b, x.to(torch.float32), a).clamp(-self.clip, self.clip)


def exportable_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the CPU in eval mode that the exporters can trace: its image
    encoders in the default memory layout, every input normalizer frozen (those of the image
    encoders and a flat one, as the Gaussian actor-critic's ``normalizer``)."""
    model = copy.deepcopy(model).cpu().eval()
    for encoder in image_encoders(model):
        if encoder.channels_last:
            encoder.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]
            encoder.channels_last = False
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, InputNormalizer):
                setattr(module, name, FrozenNormalizer(child))
    return model


def _bounds(action_space: gym.spaces.Space) -> tuple[np.ndarray, np.ndarray] | None:
    if isinstance(action_space, gym.spaces.Box):
        return action_space.low.reshape(-1), action_space.high.reshape(-1)
    if isinstance(action_space, gym.spaces.Discrete):
        return None
    raise ValueError(
        f"unsupported action space {action_space!r}: zrl exports Discrete and Box policies"
    )


class FeedForwardPolicy(nn.Module):
    """``obs -> (action, q_values | logits, value)`` of a discrete feed-forward model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: Tensor) -> tuple[Tensor, ...]:
        out = self.model(obs)
        if isinstance(out, tuple):
            return out[0].argmax(dim=-1), out[0], out[1]
        return out.argmax(dim=-1), out


class RecurrentPolicy(nn.Module):
    """``(obs, state) -> (action, q_values | logits, value, next_state)`` of a recurrent
    model (``zrl.nets.recurrent``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, ...]:
        out = self.model.step(obs, state)  # type: ignore[operator]
        return (out[0].argmax(dim=-1), *out)


class ContinuousPolicy(nn.Module):
    """``obs -> (action, value)`` or ``obs -> (action,)``: a continuous model's deterministic
    action (``act(obs, deterministic=True)`` where it has one, else its forward), clipped to
    the bounds, and its ``value(obs)`` where it has one (the Gaussian actor-critic)."""

    low: Tensor
    high: Tensor

    def __init__(self, model: nn.Module, low: np.ndarray, high: np.ndarray) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))
        self.has_value = callable(getattr(model, "value", None))

    def forward(self, obs: Tensor) -> tuple[Tensor, ...]:
        act = getattr(self.model, "act", None)
        actions = act(obs, deterministic=True) if callable(act) else self.model(obs)
        actions = actions.reshape(actions.shape[0], -1).to(torch.float32)
        actions = torch.clamp(actions, min=self.low, max=self.high)
        if self.has_value:
            return actions, self.model.value(obs)  # type: ignore[operator]
        return (actions,)


def example_obs(shape: tuple[int, ...], dtype: str, batch: int = 2) -> Tensor:
    """Observations to trace with: ``[batch, *shape]`` mid-range pixels (``uint8``) or zeros."""
    if dtype == "uint8":
        return torch.full((batch, *shape), 128, dtype=torch.uint8)
    return torch.zeros((batch, *shape), dtype=torch.float32)


def example_inputs(signature: Signature, batch: int = 2) -> tuple[Tensor, ...]:
    """Inputs of ``signature`` to trace with: observations, and a zero state where it has one."""
    obs = example_obs(signature.obs_shape, signature.obs_dtype, batch)
    if signature.state_size:
        return obs, torch.zeros(batch, signature.state_size)
    return (obs,)


def policy_module(
    model: nn.Module, observation_space: gym.spaces.Space, action_space: gym.spaces.Space
) -> tuple[nn.Module, Signature]:
    """The traceable greedy policy of ``model`` (an :func:`exportable_copy` inside) and its
    signature."""
    bounds = _bounds(action_space)
    copied = exportable_copy(model)
    dtype = str(obs_dtype(observation_space))  # uint8 frames, float32 otherwise
    shape = tuple(int(n) for n in observation_space.shape or ())
    obs = example_obs(shape, dtype)
    wrapper: nn.Module
    if bounds is not None:
        continuous = ContinuousPolicy(copied, *bounds)
        outputs = ("action", "value") if continuous.has_value else ("action",)
        return continuous, Signature(("obs",), outputs, shape, dtype)
    if is_recurrent(copied):
        wrapper = RecurrentPolicy(copied)
        state = copied.initial_state(len(obs))  # type: ignore[operator]
        with torch.no_grad():
            n_out = len(wrapper(obs, state))
        heads = ("q_values",) if n_out == 3 else ("logits", "value")
        outputs = ("action", *heads, "next_state")
        return wrapper, Signature(("obs", "state"), outputs, shape, dtype, int(state.shape[1]))
    wrapper = FeedForwardPolicy(copied)
    with torch.no_grad():
        n_out = len(wrapper(obs))
    heads = ("q_values",) if n_out == 2 else ("logits", "value")
    return wrapper, Signature(("obs",), ("action", *heads), shape, dtype)


def require_onnx() -> Any:
    """The ``onnx`` package, or ImportError with the line that installs it."""
    try:
        import onnx
    except ImportError:
        raise ImportError(f"ONNX export needs onnx and onnxruntime: {EXPORT_INSTALL}") from None
    return onnx


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` package, or ImportError with the line that installs it."""
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(f"running an ONNX policy needs onnxruntime: {EXPORT_INSTALL}") from None
    return onnxruntime


def export_policy(
    model: nn.Module,
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    path: Path,
    fmt: Format,
) -> Signature:
    """Write ``model``'s greedy policy to ``path`` as ``fmt`` (onnx or torchscript); its
    signature. ``model`` itself is left as it was (the exporters trace a copy)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    wrapper, signature = policy_module(model, observation_space, action_space)
    inputs = example_inputs(signature)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript-based exporter's deprecation notice, and tracer notes on Python
        # values it records: the tests check the files at other batch sizes.
        warnings.simplefilter("ignore")
        if fmt == "torchscript":
            traced = torch.jit.trace(wrapper, inputs, check_trace=False)
            torch.jit.save(traced, str(path), _extra_files={TORCHSCRIPT_EXTRA: signature.to_json()})
            return signature
        onnx = require_onnx()
        axes = {name: {0: "batch"} for name in (*signature.inputs, *signature.outputs)}
        torch.onnx.export(
            wrapper,
            inputs,
            str(path),
            input_names=list(signature.inputs),
            output_names=list(signature.outputs),
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, {SIGNATURE_KEY: signature.to_json()})
    onnx.save(proto, str(path))
    return signature


def format_of(path: Path) -> Format:
    """The format a file name says (``.onnx``: onnx; ``.pt``: torchscript)."""
    name = Path(path).name
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith(".pt"):
        return "torchscript"
    raise ValueError(f"{path}: an exported policy ends in .onnx (ONNX) or .pt (TorchScript)")


Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
"""An exported policy loaded to run: inputs by name -> outputs by name."""


def load_exported(path: Path) -> tuple[Runner, Signature]:
    """The exported policy at ``path`` (its format from its name), under onnxruntime or
    TorchScript, and its signature; ValueError naming the file when it is not one zrl wrote."""
    path = Path(path)
    fmt = format_of(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: write it with zrl export")
    if fmt == "onnx":
        ort = require_onnxruntime()
        try:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            meta = session.get_modelmeta().custom_metadata_map
            signature = Signature.from_json(meta[SIGNATURE_KEY])
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say which one
            raise ValueError(f"{path} is not a policy zrl exported: {_first_line(exc)}") from None

        def run_onnx(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            outs = session.run(list(signature.outputs), inputs)
            return dict(zip(signature.outputs, outs, strict=True))

        return run_onnx, signature
    extra = {TORCHSCRIPT_EXTRA: ""}
    try:
        with warnings.catch_warnings():  # torch.jit.load's deprecation notice
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
        signature = Signature.from_json(extra[TORCHSCRIPT_EXTRA])
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say which one
        raise ValueError(f"{path} is not a policy zrl exported: {_first_line(exc)}") from None

    @torch.no_grad()
    def run_torchscript(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = module(*(torch.from_numpy(inputs[name]) for name in signature.inputs))
        return {name: out.numpy() for name, out in zip(signature.outputs, outs, strict=True)}

    return run_torchscript, signature


@torch.no_grad()
def reference_outputs(
    model: nn.Module,
    signature: Signature,
    action_space: gym.spaces.Space,
    inputs: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The outputs of ``signature`` from zrl's own forward of ``model`` on ``inputs``: the
    actions as ``zrl eval`` picks them (``greedy_actions``, ``greedy_step``; continuous ones
    clipped to the bounds), the heads as the model gives them."""
    obs = torch.from_numpy(inputs["obs"])
    if signature.state_size:
        out = model.step(obs, torch.from_numpy(inputs["state"]))  # type: ignore[operator]
        action, _ = greedy_step(model, obs, torch.from_numpy(inputs["state"]))
        values = (action, *out)
    elif isinstance(action_space, gym.spaces.Box):
        actions = greedy_actions(model, obs).numpy().reshape(len(obs), -1)
        low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
        found = {"action": clip_to_bounds(actions, low, high).astype(np.float32)}
        if "value" in signature.outputs:
            found["value"] = model.value(obs).numpy()  # type: ignore[operator]
        return found
    else:
        out = model(obs)
        values = (greedy_actions(model, obs), *(out if isinstance(out, tuple) else (out,)))
    return {name: v.numpy() for name, v in zip(signature.outputs, values, strict=True)}


def max_differences(
    reference: dict[str, np.ndarray], exported: dict[str, np.ndarray]
) -> dict[str, float]:
    """The largest difference of each output from zrl's: ``|got - ref| / max(1, |ref|)``,
    absolute for values within +-1 and relative beyond (float32 holds a value of 100, a
    CartPole critic's, only to 8e-6). A differing discrete action differs by >= 1 / A."""
    diffs = {}
    for name, ref in reference.items():
        got = np.asarray(exported[name])
        if got.shape != ref.shape:
            raise ValueError(f"output {name}: shape {got.shape}, zrl's forward gives {ref.shape}")
        want = ref.astype(np.float64)
        delta = np.abs(got.astype(np.float64) - want) / np.maximum(1.0, np.abs(want))
        diffs[name] = float(delta.max()) if delta.size else 0.0
    return diffs


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__

"""Observation encoders: ``[B, *obs_shape]`` observations -> ``[B, out_features]`` features.

Image observations are channels-first ``uint8`` frame stacks ``[C, H, W]`` (Atari: 4x84x84).
They reach the model as they are; :func:`scale_obs` turns ``uint8`` into ``float32 / 255``
inside the model, on whatever device the model runs, so no float copy of a frame exists on the
CPU side (4x the bytes). Every encoder also takes the observation flattened to
``[B, prod(obs_shape)]``, as the flat ``O``-wide message arrays carry it.

A CPU learner trains the CNNs in channels-last layout (:func:`use_channels_last`): oneDNN's
convolutions run 1.4-1.5x faster per CPU-second on large batches that way (AVX2, one thread,
``benchmarks/encoders.py``). The frames are laid out channels-last while still ``uint8``, a
quarter of the bytes a float copy would move. Actors keep the default layout: on their small
batches channels-last is no faster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
ENCODERS = ("auto", "nature_cnn", "impala_resnet", "mlp")

NATURE_MIN_SIZE = 36
"""The smallest height and width the Nature CNN's strides leave at least one pixel of."""


def scale_obs(obs: Tensor) -> Tensor:
    """``uint8`` pixels -> ``float32`` in ``[0, 1]`` (``x / 255``); other dtypes -> float32."""
    if obs.dtype == torch.uint8:
        return obs.to(torch.float32).div_(255.0)
    return obs.float()


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "relu") -> nn.Sequential:
    """``Linear -> activation`` for each width in ``hidden``; empty ``hidden`` is the identity."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers)


class MLPEncoder(nn.Sequential):
    """zrl's MLP torso over the flattened observation: ``Linear -> activation`` per width.

    An ``nn.Sequential`` (of :func:`mlp`'s layers), so its ``state_dict`` keys are those of
    the plain torso (``0.weight``, ...) and checkpoints of MLP models keep loading."""

    def __init__(
        self, obs_shape: Sequence[int], hidden: Sequence[int] = (64, 64), activation: str = "relu"
    ) -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        in_dim = math.prod(obs_shape)
        super().__init__(*mlp(in_dim, hidden, activation))
        self.obs_shape = tuple(int(n) for n in obs_shape)
        self.out_features = int(hidden[-1]) if len(hidden) > 0 else in_dim

    def forward(self, obs: Tensor) -> Tensor:
        """``[B, *obs_shape]`` or ``[B, obs_dim]`` -> ``[B, out_features]``."""
        x = scale_obs(obs).flatten(start_dim=1)
        for layer in self:
            x = layer(x)
        return x


def _image_shape(name: str, obs_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(int(n) for n in obs_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(
            f"{name} needs channels-first image observations [C, H, W], got shape {shape}"
        )
    return shape  # type: ignore[return-value]


def _as_images(obs: Tensor, shape: tuple[int, int, int], channels_last: bool) -> Tensor:
    """``[B, C, H, W]`` or ``[B, C*H*W]`` -> ``[B, C, H, W]`` of the same dtype (channels-last
    in memory when ``channels_last``)."""
    images = obs.reshape(obs.shape[0], *shape)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images


def _pixel_scale(obs: Tensor) -> float:
    """What :func:`scale_obs` multiplies ``obs`` by."""
    return 1.0 / 255.0 if obs.dtype == torch.uint8 else 1.0


class InputNormalizer(nn.Module):
    """Per-pixel running mean and variance of the scaled images (Sample Factory's
    ``normalize_input``): ``((x - mean) / sqrt(var + eps))`` clipped to ``[-clip, clip]``.

    On Atari most pixels are a constant background; normalized, the few that move (ball,
    paddles) dominate the first layer's input instead of drowning in it. The statistics are
    buffers, so they travel with the weights: only the learner updates them, once per batch
    (:func:`observe_inputs`), and every other role uses the learner's.
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: Sequence[int], eps: float = 1e-5, clip: float = 5.0) -> None:
        super().__init__()
        self.eps, self.clip = eps, clip
        self.register_buffer("mean", torch.zeros(tuple(shape)))
        self.register_buffer("var", torch.ones(tuple(shape)))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def observe(self, x: Tensor, scale: float = 1.0) -> None:
        """Fold the images ``x * scale`` (``x [N, *shape]``) into the statistics (Chan et
        al.'s parallel update of the mean and the sum of squared deviations). The scale is
        applied to the statistics, not to every pixel: one pass over the batch fewer."""
        n = x.shape[0]
        if n == 0:
            return
        # E[x^2] - E[x]^2: two fast reductions instead of var_mean's slow single pass; its
        # float32 rounding (about 1e-7 of a [0, 1] pixel's variance) is far below ``eps``.
        xf = x.to(torch.float32, copy=True)
        raw_mean = xf.mean(dim=0)
        raw_var = (xf.mul_(xf).mean(dim=0) - raw_mean.square()).clamp_(min=0.0)
        batch_mean, batch_var = raw_mean * scale, raw_var * (scale * scale)
        total = self.count + n
        delta = batch_mean - self.mean
        old: float | Tensor = self.count / total
        new: float | Tensor = n / total
        if total.device.type == "cpu":  # floats; on a GPU they stay there (no host sync)
            old, new = float(old), float(new)
        self.mean += delta * new
        self.var.copy_(self.var * old + batch_var * new + delta.square() * old * new)
        self.count.copy_(total)

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """The normalized images ``x * scale``, as ``x * a + b`` (a float32 tensor of ``x``'s
        memory layout)."""
        inv_std = torch.rsqrt(self.var + self.eps)
        a, b = inv_std * scale, -self.mean * inv_std
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            # Per-pixel factors in x's layout keep the pass streaming through memory.
            a = a.unsqueeze(0).contiguous(memory_format=torch.channels_last)
            b = b.unsqueeze(0).contiguous(memory_format=torch.channels_last)
        # In place on a float copy of x: a fresh tensor per step costs its page faults.
        xf = x.to(torch.float32, copy=True)
        return torch.addcmul(b, xf, a, out=xf).clamp_(-self.clip, self.clip)


class ImageEncoder(nn.Module):
    """A CNN over ``[C, H, W]`` images; ``channels_last`` is set by :func:`use_channels_last`,
    ``normalizer`` by :func:`add_input_normalizers`."""

    channels_last = False
    obs_shape: tuple[int, int, int]
    out_features: int

    def __init__(self) -> None:
        super().__init__()
        self.normalizer: InputNormalizer | None = None

    def images(self, obs: Tensor) -> Tensor:
        """``obs`` as the float images the first convolution takes."""
        x = _as_images(obs, self.obs_shape, self.channels_last)
        if self.normalizer is None:
            return scale_obs(x)
        return self.normalizer(x, _pixel_scale(x))


class NatureCNN(ImageEncoder):
    """The DQN network's torso (Mnih et al. 2015): conv 32 8x8 s4, conv 64 4x4 s2,
    conv 64 3x3 s1, each with ReLU, then flatten, linear 512, ReLU."""

    def __init__(self, obs_shape: Sequence[int], features: int = 512) -> None:
        super().__init__()
        self.obs_shape = _image_shape("nature_cnn", obs_shape)
        channels, height, width = self.obs_shape
        if height < NATURE_MIN_SIZE or width < NATURE_MIN_SIZE:
            raise ValueError(
                f"nature_cnn needs images of at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE}, "
                f"got shape {self.obs_shape}: use impala_resnet or mlp"
            )
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
        )

        def out(n: int) -> int:
            return ((n - 8) // 4 + 1 - 4) // 2 + 1 - 2

        self.fc = nn.Linear(64 * out(height) * out(width), features)
        self.out_features = features

    def forward(self, obs: Tensor) -> Tensor:
        """``[B, C, H, W]`` (uint8 pixels or float) -> ``[B, out_features]``."""
        x = self.convs(self.images(obs))
        return torch.relu(self.fc(x.flatten(start_dim=1)))


class ResidualBlock(nn.Module):
    """``x + conv(relu(conv(relu(x))))`` with 3x3 same-padding convolutions."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaResNet(ImageEncoder):
    """The IMPALA deep torso (Espeholt et al. 2018): three sections of 16, 32, 32 channels,
    each a 3x3 conv, a 3x3 stride-2 max-pool and two residual blocks; then ReLU, flatten,
    linear 256, ReLU. Each section halves the image (rounding up): 84x84 -> 11x11."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        channels: Sequence[int] = (16, 32, 32),
        features: int = 256,
    ) -> None:
        super().__init__()
        self.obs_shape = _image_shape("impala_resnet", obs_shape)
        in_channels, height, width = self.obs_shape
        sections: list[nn.Module] = []
        for out_channels in channels:
            sections.append(
                nn.Sequential(
                    nn.Conv2d(in_channels, out_channels, 3, padding=1),
                    nn.MaxPool2d(3, stride=2, padding=1),
                    ResidualBlock(out_channels),
                    ResidualBlock(out_channels),
                )
            )
            in_channels = out_channels
            height, width = (height + 1) // 2, (width + 1) // 2
        self.sections = nn.Sequential(*sections)
        self.fc = nn.Linear(in_channels * height * width, features)
        self.out_features = features

    def forward(self, obs: Tensor) -> Tensor:
        """``[B, C, H, W]`` (uint8 pixels or float) -> ``[B, out_features]``."""
        x = torch.relu(self.sections(self.images(obs)))
        return torch.relu(self.fc(x.flatten(start_dim=1)))


def image_encoders(model: nn.Module) -> list[ImageEncoder]:
    """The image encoders (CNNs) inside ``model``."""
    return [m for m in model.modules() if isinstance(m, ImageEncoder)]


def use_channels_last(model: nn.Module) -> bool:
    """Put ``model``'s image encoders, their weights and their inputs, in channels-last
    layout; whether it has any. Outputs, ``state_dict`` keys and shapes are unchanged."""
    encoders = image_encoders(model)
    for encoder in encoders:
        encoder.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        encoder.channels_last = True
    return bool(encoders)


def add_input_normalizers(model: nn.Module) -> bool:
    """Give ``model``'s image encoders an :class:`InputNormalizer` (``model.normalize_input``),
    or the model itself where it normalizes flat observations (``model.add_normalizer()``, the
    Gaussian actor-critic of ``zrl.nets.gaussian``); whether it got any. Every role must do the
    same, as the statistics are in the weights."""
    encoders = image_encoders(model)
    for encoder in encoders:
        encoder.normalizer = InputNormalizer(encoder.obs_shape)
    add_normalizer = getattr(model, "add_normalizer", None)
    if not encoders and callable(add_normalizer):
        add_normalizer()
        return True
    return bool(encoders)


def observe_inputs(model: nn.Module, obs: Tensor) -> None:
    """Update ``model``'s input normalizers with a training batch's observations (any leading
    axes: ``[B, T, C, H, W]`` unrolls too); nothing without normalizers."""
    for encoder in image_encoders(model):
        if encoder.normalizer is not None:
            images = obs.reshape(-1, *encoder.obs_shape)
            encoder.normalizer.observe(images, _pixel_scale(images))
    flat = getattr(model, "normalizer", None)
    if callable(getattr(model, "add_normalizer", None)) and isinstance(flat, InputNormalizer):
        # the model's own, over the flattened observation (zrl.nets.gaussian)
        flat.observe(obs.reshape(-1, int(flat.mean.numel())).float())


def resolve_encoder(kind: str, obs_shape: Sequence[int]) -> str:
    """The encoder ``kind`` names; ``auto`` is ``nature_cnn`` for rank-3 (image) observation
    shapes and ``mlp`` for the others."""
    if kind not in ENCODERS:
        raise ValueError(f"encoder must be one of {list(ENCODERS)}, got {kind!r}")
    if kind == "auto":
        return "nature_cnn" if len(obs_shape) == 3 else "mlp"
    return kind


def build_encoder(
    kind: str,
    observation_space: gym.spaces.Space[Any],
    hidden: Sequence[int] = (64, 64),
    activation: str = "relu",
) -> nn.Module:
    """The encoder ``kind`` (``auto | nature_cnn | impala_resnet | mlp``) for a ``Box``
    observation space. ``hidden`` and ``activation`` shape the MLP only; the CNNs always use
    ReLU. A CNN on a space that is not ``[C, H, W]`` is a ValueError naming the shape."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: zrl encoders need a Box"
        )
    shape = tuple(int(n) for n in observation_space.shape)
    resolved = resolve_encoder(kind, shape)
    if resolved == "nature_cnn":
        return NatureCNN(shape)
    if resolved == "impala_resnet":
        return ImpalaResNet(shape)
    return MLPEncoder(shape, hidden, activation)

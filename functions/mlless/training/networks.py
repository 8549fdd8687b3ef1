"""The networks a `neural-net` or `neural-net-regression` job trains (`spec.model.network`, `spec.model.module`), as
`torch.nn.Module`s.

Every one maps a float batch of shape (rows, channels, height, width) to (rows, classes) logits (a regression's one
output: `classes` is 1), and keeps all its state in its parameters: the replica is one flat vector of them
(training/models/network.py), which the optimizer steps, the workers exchange and `Model.save` writes. So there are
no BatchNorm layers, whose running statistics are buffers outside that vector (and which every replica would gather
from its own batches alone):

- `mlp`: flattened pixels, hidden ReLU layers of `hiddenSizes`;
- `lenet`: LeNet-5's shape (two 5×5 convolutions of 6 and 16 channels, each with ReLU and 2×2 max-pooling, then
  120, 84 and the classes), padded to keep each side, and pooling only while a side stays `MIN_SIDE` or more: an
  8×8 image is pooled once, to 4×4, where pooling twice would leave the dense layers 2×2 maps of 16 values;
- `cnn`: Keras's small CNN for MNIST (two 3×3 'same' convolutions of 32 and 64 channels with ReLU, one 2×2
  max-pooling, a dense layer of 128): on the digits' 8×8 images (examples/digits-cnn.yaml), plain PyTorch with Adam
  on batches of 128 ended at 97-99 % validation accuracy for seeds 0-2, where `lenet`, whose 5×5 kernels see mostly
  padding there, ended at 94-97.5 %;
- `mobilenet_v3_small` and `resnet18`: torchvision's builders, with no pretrained weights (nothing is downloaded) and
  GroupNorm (Wu and He 2018: batch-independent, its affine weights are parameters) in place of BatchNorm, with 32
  groups or fewer so that a group keeps at least 4 channels. Their stem takes the data's channels, and on images
  smaller than 64 pixels a side it keeps the full resolution (stride 1; ResNet without its max-pool, as ResNets for
  CIFAR are built): ImageNet's stem would shrink a 32×32 image to 1×1 before the last stage.

`build` returns the named network, or the user's ("package.module:build", called with the input shape and the
number of classes); `NetworkError` is one line saying why a network cannot train on the data.
"""
from __future__ import annotations

import importlib
import math
from typing import Callable, Sequence

import torch
from torch import nn

#: An image side below this keeps its full resolution in the stem of the torchvision networks.
SMALL_IMAGE = 64
#: LeNet pools a map only while its sides stay at least this long.
MIN_SIDE = 4
#: GroupNorm's groups (Wu and He's default), and the fewest channels a group keeps.
GROUPS, GROUP_CHANNELS = 32, 4


class NetworkError(ValueError):
    """A network cannot be built, or does not fit the data: one line."""


Shape = tuple[int, int, int]  # channels, height, width


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm over `channels`: the most groups up to `GROUPS` that divide them with `GROUP_CHANNELS` or more each."""
    groups = max(g for g in range(1, GROUPS + 1) if channels % g == 0 and (channels // g >= GROUP_CHANNELS or g == 1))
    return nn.GroupNorm(groups, channels)


def mlp(shape: Shape, classes: int, hidden: Sequence[int]) -> nn.Module:
    widths = [math.prod(shape), *hidden]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], classes))


def lenet(shape: Shape, classes: int) -> nn.Module:
    channels, height, width = shape
    layers: list[nn.Module] = []
    for into, out in ((channels, 6), (6, 16)):  # 'same' convolutions: only a pool shrinks the map
        layers += [nn.Conv2d(into, out, 5, padding=2), nn.ReLU()]
        if min(height, width) // 2 >= MIN_SIDE:
            layers.append(nn.MaxPool2d(2))
            height, width = height // 2, width // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * height * width, 120), nn.ReLU(),
                         nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))


def cnn(shape: Shape, classes: int) -> nn.Module:
    channels, height, width = shape
    return nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * (height // 2) * (width // 2), 128), nn.ReLU(),
                         nn.Linear(128, classes))


def _stem(conv: nn.Conv2d, channels: int, small: bool) -> nn.Conv2d:
    """`conv` taking `channels` input channels, at stride 1 and with a 3×3 kernel for a small image."""
    kernel, stride, padding = ((3, 3), 1, 1) if small else (conv.kernel_size, conv.stride, conv.padding)
    return nn.Conv2d(channels, conv.out_channels, kernel, stride, padding, bias=conv.bias is not None)


def mobilenet_v3_small(shape: Shape, classes: int) -> nn.Module:
    from torchvision.models import mobilenet_v3_small as build

    net = build(weights=None, num_classes=classes, norm_layer=group_norm)
    net.features[0][0] = _stem(net.features[0][0], shape[0], min(shape[1:]) < SMALL_IMAGE)
    return net


def resnet18(shape: Shape, classes: int) -> nn.Module:
    from torchvision.models import resnet18 as build

    net = build(weights=None, num_classes=classes, norm_layer=group_norm)
    small = min(shape[1:]) < SMALL_IMAGE
    net.conv1 = _stem(net.conv1, shape[0], small)
    if small:
        net.maxpool = nn.Identity()
    return net


def user_network(path: str, shape: Shape, classes: int) -> nn.Module:
    """What the user's "package.module:build" returns for this shape and these classes."""
    module_name, _, attribute = path.partition(":")
    where = f"spec.model.module {path!r}"
    if not module_name or not attribute:
        raise NetworkError(f"{where}: expected \"package.module:build\"")
    try:
        factory: Callable[[Shape, int], object] = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise NetworkError(f"{where} is not importable: {type(exc).__name__}: {exc}") from None
    try:
        net = factory(shape, classes)
    except Exception as exc:  # noqa: BLE001 - the user's code; its failure is one line
        raise NetworkError(f"{where} failed for input {shape} and {classes} classes: "
                           f"{type(exc).__name__}: {exc}") from None
    if not isinstance(net, nn.Module):
        raise NetworkError(f"{where} returned a {type(net).__name__}, not a torch.nn.Module")
    return net


def build(network: str, hidden: Sequence[int], module: str | None, shape: Shape, classes: int) -> nn.Module:
    """The network for images of `shape` and `classes` classes (1: a regression's one output), checked to give one
    output per class and to keep its whole state in its parameters; `NetworkError` otherwise."""
    if module:
        net, name = user_network(module, shape, classes), f"spec.model.module {module!r}"
    else:
        built = {"mlp": lambda: mlp(shape, classes, hidden), "lenet": lambda: lenet(shape, classes),
                 "cnn": lambda: cnn(shape, classes),
                 "mobilenet_v3_small": lambda: mobilenet_v3_small(shape, classes),
                 "resnet18": lambda: resnet18(shape, classes)}
        if network not in built:
            raise NetworkError(f"spec.model.network {network!r} is none of {sorted(built)}")
        net, name = built[network](), f"spec.model.network {network}"
    if state := [key for key in net.state_dict() if key not in dict(net.named_parameters())]:
        raise NetworkError(f"{name} keeps state outside its parameters ({', '.join(state[:3])}: BatchNorm's running "
                           "statistics?): mlless trains, exchanges and saves parameters only; use GroupNorm")
    fits(net, name, shape, classes)
    return net


def fits(net: nn.Module, name: str, shape: Shape, classes: int) -> None:
    """`NetworkError` unless `net` maps two images of `shape` to (2, classes) logits."""
    try:
        with torch.no_grad():
            out = net.eval()(torch.zeros((2, *shape)))
    except Exception as exc:  # noqa: BLE001 - any failure of the forward pass means it does not fit
        raise NetworkError(f"{name} does not fit {shape[0]}×{shape[1]}×{shape[2]} images: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    finally:
        net.train()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise NetworkError(f"{name} gives {got} for 2 images, not (2, {classes}) "
                           + ("logits, one per class" if classes > 1 else "outputs, one a target"))

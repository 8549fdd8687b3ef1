"""spec.model.type neural-net: a torch network whose parameters are the replica's flat vector
(training/models/network.py, training/networks.py). Tiny networks and batches built here, so that each test takes
a second or less, but for the digits example's end-to-end run."""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mlless.cli import main  # noqa: E402
from mlless.contract import ENV_CPU_CORES  # noqa: E402
from mlless.data.batches import ImageBatch  # noqa: E402
from mlless.spec.config import ModelConfig, OptimizerConfig  # noqa: E402
from mlless.spec.models import BUILT_IN, FUNCTION_MEMORY, NETWORKS, model_type  # noqa: E402
from mlless.spec.schema import pairing_errors  # noqa: E402
from mlless.training import networks  # noqa: E402
from mlless.training.models import build_model, load_model  # noqa: E402
from mlless.training.models.network import torch_threads  # noqa: E402
from mlless.training.optim import Optimizer  # noqa: E402


ROOT = Path(__file__).resolve().parent.parent


def dims(channels: int = 1, side: int = 8, classes: int = 4) -> dict:
    return {"channels": channels, "height": side, "width": side, "n_classes": classes,
            "pixel_mean": [100.0 + c for c in range(channels)], "pixel_std": [50.0 + c for c in range(channels)]}


def net(network: str = "mlp", *, d: dict | None = None, seed: int = 0, **options):
    options = {"network": network, **({"hiddenSizes": [6]} if network == "mlp" else {}), **options}
    return build_model("neural-net", d or dims(), ModelConfig("neural-net", options=options), seed)


def learnable(rows: int, d: dict, seed: int = 0) -> ImageBatch:
    """Class k lights the k-th band of rows of the image, over noise: a batch a network can learn."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, d["n_classes"], rows).astype(np.int32)
    images = rng.integers(0, 120, (rows, d["channels"], d["height"], d["width"]))
    band = d["height"] // d["n_classes"]
    for row, k in enumerate(labels):
        images[row, :, k * band:(k + 1) * band] += 120
    return ImageBatch(images.astype(np.uint8), labels)


def tiny(shape: tuple[int, int, int], classes: int) -> nn.Module:
    """A user's network, by "test_network:tiny"."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(shape)), classes))


def not_a_module(shape, classes):
    return [shape, classes]


def wrong_width(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(3, classes))


def with_batchnorm(shape, classes):
    return nn.Sequential(nn.BatchNorm2d(shape[0]), nn.Flatten(), nn.Linear(int(np.prod(shape)), classes))


def test_the_gradient_is_the_mean_loss_and_matches_finite_differences():
    model = net()
    batch = learnable(12, dims())
    idx, grad, loss_sum, n = model.gradient(batch)
    np.testing.assert_array_equal(idx, np.arange(model.size))  # dense: every parameter
    assert n == 12 and loss_sum == pytest.approx(model.evaluate(batch)[0], rel=1e-5)
    assert_finite_differences(model, batch, grad, abs=2e-4)


def assert_finite_differences(model, batch: ImageBatch, grad: np.ndarray, abs: float, samples: int = 25) -> None:
    """`grad`, the gradient of the mean loss on `batch`, matches central differences of `model.evaluate`'s loss
    sum at `samples` parameters drawn at random."""
    rng = np.random.default_rng(1)
    eps = 1e-3  # at 1e-2 a pre-activation crosses ReLU's kink for some weights
    for i in rng.choice(model.size, samples, replace=False):
        x = model.params[i]
        model.params[i] = x + eps
        up = model.evaluate(batch)[0]
        model.params[i] = x - eps
        down = model.evaluate(batch)[0]
        model.params[i] = x
        assert grad[i] == pytest.approx((up - down) / (2 * eps) / len(batch), abs=abs, rel=2e-2), i


def test_the_networks_parameters_are_views_of_the_replica():
    model = net()
    batch = learnable(5, dims())
    before = model.predict(batch)
    model.apply_update(np.arange(model.size, dtype=np.int32), np.full(model.size, 0.1, np.float32))
    moved = model.predict(batch)
    assert not np.allclose(before, moved)
    model.set_params(model.params - 0.1)
    np.testing.assert_allclose(model.predict(batch), before, atol=1e-5)
    first = next(model.net.parameters())
    assert first.data_ptr() == model.params.ctypes.data  # the first parameter is the vector's head, not a copy


def test_the_loss_falls_under_the_optimizer():
    d = dims(classes=4)
    model, batch = net("lenet", d=d), learnable(64, d)
    optimizer = Optimizer(model.size, OptimizerConfig("adam", learning_rate=0.01))
    losses = [optimizer.update(model, batch, 0.01)[2] / len(batch) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    assert model.scores(batch)["accuracy"] > 0.9


def test_the_same_seed_builds_the_same_replica_on_every_worker():
    assert np.array_equal(net("lenet", seed=3).params, net("lenet", seed=3).params)
    assert not np.array_equal(net("lenet", seed=3).params, net("lenet", seed=4).params)


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("channels, side", [(1, 8), (3, 32)])
def test_every_built_in_network_fits_small_and_cifar_images(network, channels, side):
    d = dims(channels, side, classes=10)
    model = net(network, d=d)
    batch = learnable(3, d)
    assert model.logits(batch).shape == (3, 10)
    assert not any(True for _ in model.net.buffers())  # every state is a parameter: no BatchNorm statistics
    assert model.size == sum(p.numel() for p in model.net.parameters())
    assert set(model.scores(batch)) == {"accuracy", "top5_accuracy"}


@pytest.mark.parametrize("side, pools", [(8, 1), (9, 1), (7, 0), (32, 2)])
def test_lenet_pools_only_while_a_side_stays_at_least_min_side(side, pools):
    layers = networks.lenet((1, side, side), 10)
    assert sum(isinstance(layer, nn.MaxPool2d) for layer in layers) == pools
    networks.fits(layers, "lenet", (1, side, side), 10)


def test_a_users_module_trains_by_its_path():
    model = net(module="test_network:tiny")
    assert model.size == 64 * 4 + 4
    idx, grad, loss_sum, n = model.gradient(learnable(4, dims()))
    assert n == 4 and np.abs(grad).sum() > 0


@pytest.mark.parametrize("module, says", [
    ("no_such_package.net:build", "is not importable: ModuleNotFoundError: No module named 'no_such_package'"),
    ("test_network:missing", "is not importable: AttributeError"),
    ("test_network", 'expected "package.module:build"'),
    ("test_network:not_a_module", "returned a list, not a torch.nn.Module"),
    ("test_network:wrong_width", "does not fit 1×8×8 images: RuntimeError"),
    ("test_network:with_batchnorm", "keeps state outside its parameters (0.running_mean"),
])
def test_a_bad_users_module_gets_one_line(module, says):
    with pytest.raises(ValueError) as caught:
        net(module=module)
    line = str(caught.value)
    assert says in line and "\n" not in line and line.startswith(f"spec.model.module {module!r}")


def test_a_saved_network_loads_with_the_same_predictions(tmp_path):
    for model in (net("lenet", seed=5), net(module="test_network:tiny", seed=5)):
        batch = learnable(6, dims())
        Optimizer(model.size, OptimizerConfig("adam", learning_rate=0.01)).update(model, batch, 0.01)
        model.save(tmp_path / "model.npz")
        loaded = load_model(tmp_path / "model.npz")
        assert loaded.config() == model.config() and loaded.dims() == model.dims()
        np.testing.assert_array_equal(loaded.predict(batch), model.predict(batch))


def test_the_saved_state_dict_predicts_as_the_model_in_plain_pytorch(tmp_path):
    """model.pt (`save_native`) into a network built by `networks.build`, or the user's module, fed pixels normalised
    with the model's statistics: the same probabilities as the mlless model."""
    d = dims()
    batch = learnable(6, d)
    for model, module in ((net("lenet", seed=5), None), (net(module="test_network:tiny", seed=5), "test_network:tiny")):
        Optimizer(model.size, OptimizerConfig("adam", learning_rate=0.01)).update(model, batch, 0.01)
        assert model.save_native(tmp_path) == ["model.pt"]
        network = networks.build("lenet", [], module, (1, 8, 8), d["n_classes"])
        network.load_state_dict(torch.load(tmp_path / "model.pt"))
        pixels = (batch.images.astype(np.float32) - model.pixel_mean[:, None, None]) / model.pixel_std[:, None, None]
        with torch.no_grad():
            probabilities = torch.softmax(network.eval()(torch.from_numpy(pixels)), dim=1).numpy()
        np.testing.assert_allclose(probabilities, model.predict(batch), rtol=1e-5, atol=1e-6)


def test_labels_beyond_the_classes_and_other_shapes_are_refused():
    model = net()
    with pytest.raises(ValueError, match="label 4 is none of the model's 4 classes"):
        model.gradient(ImageBatch(np.zeros((1, 1, 8, 8), np.uint8), np.array([4], np.int32)))
    with pytest.raises(ValueError, match=r"built for \(1, 8, 8\) images, got \(3, 8, 8\)"):
        model.evaluate(ImageBatch(np.zeros((1, 3, 8, 8), np.uint8), np.array([0], np.int32)))


def test_blocked_and_admm_refuse_a_network():
    for protocol in ("blocked", "admm"):
        assert [line.split(" needs ")[0] for line in pairing_errors(
            {"model": {"type": "neural-net"}, "sync": {"protocol": protocol}})] == [f"spec.sync.protocol: {protocol}"]
    assert list(pairing_errors({"model": {"type": "neural-net"}, "sync": {"protocol": "bsp"}})) == []


def test_a_worker_takes_its_share_of_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert torch_threads(1, {}) == cores and torch_threads(cores * 4, {}) == 1
    assert all(1 <= torch_threads(p, {}) <= cores for p in range(1, 9))
    before = torch.get_num_threads()
    try:
        net().share_cores(cores)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_function_computes_on_the_cores_it_was_given_whatever_the_workers():
    """On Kubernetes each worker is its own function: its CPU request (MLLESS_CPU_CORES, set by the operator), not
    the node's cores over the job's workers."""
    cores = len(os.sched_getaffinity(0))
    assert torch_threads(8, {ENV_CPU_CORES: "3"}) == 3 and torch_threads(1, {ENV_CPU_CORES: str(cores + 5)}) == cores + 5
    assert torch_threads(cores * 4, {ENV_CPU_CORES: "0"}) == 1
    assert torch_threads(cores * 4, {ENV_CPU_CORES: " "}) == 1  # unset: the local share
    with pytest.raises(ValueError, match=f"^{ENV_CPU_CORES}: '1.5' is not a whole number of cores$"):
        torch_threads(1, {ENV_CPU_CORES: "1.5"})


def test_a_network_asks_for_larger_functions_and_the_torch_extra():
    """What the operator reads of the model type (mlless.spec.models): no part of it names the model."""
    networks = ("neural-net", "neural-net-regression")
    for kind in map(model_type, networks):
        assert kind.function_memory == "3Gi" and kind.extra == "torch"
        assert kind.extra in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {t.function_memory for t in BUILT_IN if t.name not in networks} == {FUNCTION_MEMORY}
    assert {t.extra for t in BUILT_IN if t.name not in networks} == {None}


def test_the_digits_example_trains_a_cnn_on_two_workers(tmp_path, capsys):
    """The quickstart: `mlless prepare --sample digits` and `mlless train examples/digits-cnn.yaml` at P = 2 over the
    embedded transport; 200 held-out images. With its defaults (cnn, Adam at 0.001, gradient averaging) the example
    ended at 97-97.5 % for seeds 0-2 (issue 46's target is 97 %: met, without a margin, so the bound stays lower)."""
    pytest.importorskip("sklearn")
    example = Path(__file__).resolve().parent.parent / "examples" / "digits-cnn.yaml"
    (tmp_path / "examples").mkdir()
    # With an output.uri, as on Kubernetes, where the run directory dies with the supervisor pod.
    (tmp_path / "examples" / example.name).write_text(example.read_text() + "  output:\n    uri: ../exported\n")
    assert main(["prepare", "--sample", "digits", "--out", str(tmp_path / "data" / "digits")]) == 0
    assert main(["train", str(tmp_path / "examples" / example.name), "--out", str(tmp_path / "run"), "-q"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers_final"] == 2 and summary["rejected_frames"] == 0
    assert (tmp_path / "run" / "model.pt").is_file()  # the state_dict beside model.npz
    # The state_dict goes to output.uri with the model and the record (telemetry/record.py, NATIVE_FILES).
    assert summary["native_model_files"] == ["model.pt"]
    assert sorted(p.name for p in (tmp_path / "exported").iterdir()) == [
        "metrics.jsonl", "model.npz", "model.pt", "summary.json"]
    assert (tmp_path / "exported" / "model.pt").read_bytes() == (tmp_path / "run" / "model.pt").read_bytes()
    assert summary["validation_scores"]["accuracy"] >= 0.95, summary["validation_scores"]
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run" / "model.npz"), str(tmp_path / "data" / "digits")]) == 0
    assert json.loads(capsys.readouterr().out)["validation_accuracy"] == summary["validation_scores"]["accuracy"]

"""spec.model.type neural-net-regression: the networks of neural-net with one output, label_mean + label_std × which
predicts a real target, trained on the squared error and reported as RMSE (training/models/network.py,
`NeuralNetRegression`). Tiny networks and batches, but for one end-to-end run of `mlless train` at P = 2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mlless.cli import main  # noqa: E402
from mlless.contract import EXIT_USAGE  # noqa: E402
from mlless.data.batches import ImageBatch  # noqa: E402
from mlless.spec.config import ModelConfig, OptimizerConfig  # noqa: E402
from mlless.spec.models import model_type  # noqa: E402
from mlless.spec.schema import pairing_errors  # noqa: E402
from mlless.training import networks  # noqa: E402
from mlless.training.models import build_model, load_model  # noqa: E402
from mlless.training.optim import Optimizer  # noqa: E402
from test_network import assert_finite_differences, dims as class_dims  # noqa: E402

KIND = "neural-net-regression"


def dims(channels: int = 1, side: int = 8, mean: float = 60.0, std: float = 25.0) -> dict:
    d = class_dims(channels, side)
    del d["n_classes"]
    return d | {"label_mean": mean, "label_std": std}


def net(network: str = "mlp", *, d: dict | None = None, seed: int = 0, **options):
    options = {"network": network, **({"hiddenSizes": [6]} if network == "mlp" else {}), **options}
    return build_model(KIND, d or dims(), ModelConfig(KIND, options=options), seed)


def brightness(rows: int, channels: int = 1, side: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images of noise whose top band of rows is lit by a random level; each image's target is that band's mean
    brightness (0-255): learnable from the pixels, and spread about its mean (the baseline's error)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 100, (rows, channels, side, side))
    images[:, :, : side // 4] += rng.integers(0, 156, (rows, 1, 1, 1))
    return images.astype(np.uint8), images[:, :, : side // 4].mean(axis=(1, 2, 3)).astype(np.float32)


def batch(rows: int, seed: int = 0) -> ImageBatch:
    return ImageBatch(*brightness(rows, seed=seed))


def test_the_mse_gradient_is_the_mean_loss_and_matches_finite_differences():
    model = net()
    b = batch(12)
    idx, grad, loss_sum, n = model.gradient(b)
    np.testing.assert_array_equal(idx, np.arange(model.size))
    assert n == 12 and loss_sum == pytest.approx(model.evaluate(b)[0], rel=1e-5)
    assert loss_sum == pytest.approx(float(((model.predict(b).astype(np.float64) - b.labels) ** 2).sum()), rel=1e-5)
    # In the targets' units (a standard deviation of 25 here) the gradient is larger than a class's: a looser abs.
    assert_finite_differences(model, b, grad, abs=2e-3)


def test_the_output_is_one_value_about_the_targets_mean_at_any_scale():
    """A fresh network predicts near label_mean, spread like label_std: targets in any units start alike."""
    b = batch(64)
    for mean, std in ((0.5, 0.01), (60.0, 25.0), (3e5, 4e4)):
        predicted = net("lenet", d=dims(mean=mean, std=std)).predict(b)
        assert predicted.shape == (64,) and predicted.dtype == np.float32
        assert abs(float(predicted.mean()) - mean) < 2 * std and 0 < float(predicted.std()) < 2 * std


def test_the_loss_falls_under_the_optimizer_below_the_mean_baseline():
    model, b = net("lenet"), batch(64)
    model.label_mean, model.label_std = float(b.labels.mean()), float(b.labels.std())
    optimizer = Optimizer(model.size, OptimizerConfig("adam", learning_rate=0.01))
    for _ in range(40):
        optimizer.update(model, b, 0.01)
    baseline = float(b.labels.std())  # the RMSE of predicting the mean
    assert model.loss(*model.evaluate(b)) < 0.3 * baseline
    assert model.scores(b) == {}  # as linear-regression's: RMSE is its figure


def test_a_saved_regression_network_loads_and_predicts_in_plain_pytorch(tmp_path):
    """model.npz loads with its target statistics; model.pt into `networks.build` (one output) or the user's module
    gives the same predictions as label_mean + label_std × its output on normalised pixels."""
    b = batch(6)
    for model, module in ((net("lenet", seed=5), None), (net(module="test_network:tiny", seed=5), "test_network:tiny")):
        Optimizer(model.size, OptimizerConfig("adam", learning_rate=0.01)).update(model, b, 0.01)
        model.save(tmp_path / "model.npz")
        loaded = load_model(tmp_path / "model.npz")
        assert loaded.kind == KIND and loaded.dims() == model.dims() == dims()
        np.testing.assert_array_equal(loaded.predict(b), model.predict(b))
        assert model.save_native(tmp_path) == ["model.pt"]
        network = networks.build("lenet", [], module, (1, 8, 8), 1)
        network.load_state_dict(torch.load(tmp_path / "model.pt"))
        pixels = (b.images.astype(np.float32) - model.pixel_mean[:, None, None]) / model.pixel_std[:, None, None]
        with torch.no_grad():
            out = network.eval()(torch.from_numpy(pixels)).numpy()[:, 0]
        np.testing.assert_allclose(out * dims()["label_std"] + dims()["label_mean"], model.predict(b), rtol=1e-5)


def test_class_ids_and_bad_statistics_are_refused():
    with pytest.raises(ValueError, match="trains on real targets, got int32 labels"):
        net().gradient(ImageBatch(np.zeros((1, 1, 8, 8), np.uint8), np.array([1], np.int32)))
    with pytest.raises(ValueError, match="neural-net trains on class ids, got float32 labels"):
        build_model("neural-net", class_dims()).gradient(batch(2))
    for bad in ({"label_std": 0.0}, {"label_mean": float("nan")}):
        with pytest.raises(ValueError, match="a finite label_mean and a positive label_std"):
            net(d=dims() | bad)
    with pytest.raises(ValueError, match=r"needs dims\['label_std'\]"):
        build_model(KIND, {k: v for k, v in dims().items() if k != "label_std"})


def test_the_type_shares_the_networks_fields_and_defaults():
    regression, classes = model_type(KIND), model_type("neural-net")
    assert regression.fields is classes.fields and regression.labels == frozenset({"real"})
    assert (regression.loss_metric, classes.loss_metric) == ("rmse", "cross-entropy")
    assert (regression.protocol, regression.optimizer, regression.traits) == \
        (classes.protocol, classes.optimizer, classes.traits)
    assert net(augment={"flip": True}).config().options["augment"] == {"crop": 0, "flip": True}
    for protocol in ("blocked", "admm"):
        assert list(pairing_errors({"model": {"type": KIND}, "sync": {"protocol": protocol}}))
    assert list(pairing_errors({"model": {"type": KIND}})) == []


def job(path: Path, model_type: str, data: str, **model) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "bands"},
        "spec": {"workers": 2, "model": {"type": model_type, **model}, "dataset": {"uri": data, "cacheBatches": True},
                 "stop": {"maxEpochs": 30}}}))
    return path


def test_a_regression_network_learns_band_brightness_on_two_workers(tmp_path, capsys):
    """`mlless prepare --labels real` and `mlless train` at P = 2 on the defaults (Adam at 0.001, gradient averaging):
    the validation RMSE ends far below the baseline's, the RMSE of predicting the training targets' mean. Each
    network refuses the other's data set in one line."""
    x, y = brightness(1200, seed=3)
    np.savez(tmp_path / "bands.npz", X=x[:, 0], y=y)
    assert main(["prepare", "--format", "npz", str(tmp_path / "bands.npz"), "--labels", "real", "--quiet",
                 "--out", str(tmp_path / "data")]) == 0
    spec = job(tmp_path / "job.yaml", KIND, str(tmp_path / "data"), network="mlp", hiddenSizes=[32])
    assert main(["train", str(spec), "--out", str(tmp_path / "run"), "-q"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["workers_final"] == 2 and summary["rejected_frames"] == 0 and summary["loss_metric"] == "rmse"
    assert (tmp_path / "run" / "model.pt").is_file()

    from mlless.data.dataset import Dataset
    data = Dataset.open(str(tmp_path / "data"))
    held = data.validation().labels.astype(np.float64)
    baseline = float(np.sqrt(np.mean((held - data.dims()["label_mean"]) ** 2)))
    assert summary["validation_loss"] < 0.25 * baseline, (summary["validation_loss"], baseline)
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run" / "model.npz"), str(tmp_path / "data")]) == 0
    assert json.loads(capsys.readouterr().out)["validation"] == pytest.approx(summary["validation_loss"], rel=1e-6)

    # The pairing: a classifier refuses real targets, and the regression network a set of classes.
    np.savez(tmp_path / "classes.npz", X=x[:, 0], y=(y > np.median(y)).astype(int))
    assert main(["prepare", "--format", "npz", str(tmp_path / "classes.npz"), "--quiet",
                 "--out", str(tmp_path / "classes")]) == 0
    capsys.readouterr()
    for model, data_dir, says in (("neural-net", "data", "fits classes labels, and"),
                                  (KIND, "classes", "fits real labels, and")):
        spec = job(tmp_path / "other.yaml", model, str(tmp_path / data_dir))
        assert main(["train", str(spec), "--out", str(tmp_path / "refused"), "-q"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert main(["evaluate", str(tmp_path / "run" / "model.npz"), str(tmp_path / "classes")]) == EXIT_USAGE
    assert "holds 2 classes (0, 1), and a neural-net-regression model fits real labels" in capsys.readouterr().err

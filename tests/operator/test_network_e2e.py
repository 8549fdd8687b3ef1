"""End to end: a `neural-net` TrainingJob on the operator, its pods run by the kubelet stand-in (as in
test_kubelet_e2e.py): what the operator gives a network's pods (the image for the torch extra, the model type's
memory, the cores of the CPU request), and that the real supervisor and workers train the network on the digits
sample and hand its model.pt to spec.output.uri."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mlless.cli import main as mlless_main
from mlless.contract import ENV_CPU_CORES
from scenario import NS, PODS, TERMINAL, exit_code, job_status, launched, metrics_rows, pod_phase, training_job, unique, until

from test_kubelet_e2e import assert_succeeded

# Looked up, not imported: collecting the suite should not load torch in the test process (the pods import it).
pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("torch", "sklearn")),
                                reason="needs torch (the network) and scikit-learn (the digits sample)")

#: The operator's image for the torch extra (the chart's operator.extraImages), and the plain ones beside it.
TORCH_IMAGE = "registry.example/mlless:test-torch"
WORKER_IMAGE = "registry.example/mlless:test-worker"
#: A small network on 2 workers, 30 steps of 64 images: it reached 90 % validation accuracy where 10 classes give 10 %.
STEPS = 30


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "digits"
    assert mlless_main(["prepare", "--sample", "digits", "--out", str(out)]) == 0
    return out


@pytest.mark.asyncio
@pytest.mark.services
@pytest.mark.slow
async def test_a_network_job_runs_on_the_torch_image_with_its_resources_and_trains(
        cluster_factory, digits_dir, redis_url, amqp_url, tmp_path, monkeypatch):
    monkeypatch.setenv("MLLESS_OPERATOR_EXTRA_IMAGES", f"torch={TORCH_IMAGE}")
    monkeypatch.setenv("MLLESS_OPERATOR_WORKER_IMAGE", WORKER_IMAGE)
    exported = tmp_path / "exported"
    doc = training_job(unique("net"), digits_dir, redis_url, amqp_url, function={"backend": "pod", "cpu": "1500m"},
                       model={"type": "neural-net", "network": "mlp", "hiddenSizes": [32]},
                       optimizer={"type": "adam", "learningRate": 0.01}, stop={"maxSteps": STEPS},
                       output={"uri": str(exported)})
    doc["spec"]["dataset"]["cacheBatches"] = True
    async with launched(cluster_factory, tmp_path, doc) as job:
        c, kubelet, name = job
        await job.until(lambda: c.get(PODS, f"{name}-worker-1"), "the worker pods")
        supervisor, workers = c.get(PODS, f"{name}-supervisor"), [c.get(PODS, f"{name}-worker-{r}") for r in (0, 1)]
        # The supervisor builds the network to evaluate it: it runs on the torch image too.
        assert supervisor["spec"]["containers"][0]["image"] == TORCH_IMAGE
        for pod in workers:
            container = pod["spec"]["containers"][0]
            assert container["image"] == TORCH_IMAGE  # not the plain worker image
            # The model type's memory (mlless.spec.models, neural-net), the job's CPU, and its cores for torch.
            assert container["resources"] == {"requests": {"cpu": "1500m", "memory": "3Gi"}, "limits": {"memory": "3Gi"}}
            assert {e["name"]: e.get("value") for e in container["env"]}[ENV_CPU_CORES] == "2"

        await job.until(lambda: c.job(name).get("status", {}).get("phase") in TERMINAL, "the job to finish")
        assert exit_code(c.get(PODS, f"{name}-supervisor")) == 0
        await until(lambda: all(pod_phase(c, f"{name}-worker-{r}") in TERMINAL for r in (0, 1)), "the worker pods to end", kubelet)
        summary = await assert_succeeded(c, kubelet, name)
        assert summary["steps"] == STEPS and summary["workers_final"] == 2 and summary["model"] == "neural-net"

        # It learned: the loss fell, and the model tells the digits apart far above chance.
        rows = metrics_rows(kubelet.pod(NS, f"{name}-supervisor"))
        assert rows[-1]["loss"] < rows[0]["loss"] / 3, [r["loss"] for r in rows]
        assert summary["validation_scores"]["accuracy"] >= 0.8, summary["validation_scores"]
        # What outlives the supervisor pod: the model in both formats and the record.
        assert sorted(p.name for p in exported.iterdir()) == ["metrics.jsonl", "model.npz", "model.pt", "summary.json"]
        assert json.loads((exported / "summary.json").read_text())["native_model_files"] == ["model.pt"]
        assert (await job_status(c, name))["modelURI"] == f"{exported}/model.npz"

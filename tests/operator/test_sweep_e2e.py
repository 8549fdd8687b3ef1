"""End to end: `kubectl apply` a TrainingSweep; the operator creates its trial TrainingJobs, the kubelet stand-in runs
their pods (real supervisors and workers on the real Redis and RabbitMQ), ASHA stops the losers, the best trial's
model is copied to the sweep's output, and deleting the sweep deletes its trials. And, the test writing the trials'
statuses as their supervisors would (no pods run), ASHA counting epochs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest

from mlless.contract import LABEL_SWEEP, STOP_ASHA, SWEEP_KIND
from mlless_operator.handlers.sweep import NO_OUTPUT
from scenario import NS, TJ, launched, running_operator, training_job, unique

SWEEPS = kmock.resource("mlless.io/v1alpha1/trainingsweeps")
#: A trial's length: long enough that the operator sees a loser at a rung before it ends. A supervisor patches its
#: TrainingJob's status at most every 2 s (`mlless.launch.kube`), and a quiet machine ran 1000 steps in less: the
#: operator saw each trial only at its end, when nothing is left to stop.
MAX_STEPS = 4000


def sweep_doc(name: str, dataset: Path, redis_url: str, amqp_url: str, out: Path) -> dict[str, Any]:
    template = training_job("template", dataset, redis_url, amqp_url)["spec"]
    template |= {"workers": 1, "stop": {"maxSteps": MAX_STEPS}, "evaluation": {"everySteps": 10},
                 "function": {"backend": "pod"}}
    template["dataset"]["cacheBatches"] = True
    return {
        "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingSweep", "metadata": {"name": name, "namespace": NS},
        "spec": {
            "template": {"spec": template},
            # The good learning rate first, one trial at a time: the first trial at a rung always goes on, and the
            # others meet it there (reduction factor 2: a rung judges from its second value,
            # `mlless.sweep.asha.min_peers`). Two at once raced: a trial the operator first saw past some rungs
            # recorded them before its peer, and a trial alone at a rung goes on.
            "parameters": [{"field": "optimizer.learningRate", "grid": [0.2, 0.002, 0.001]}],
            "maxConcurrentTrials": 1,
            "earlyStopping": {"type": "asha", "resource": "steps", "minResource": 20, "reductionFactor": 2},
            "output": {"uri": str(out)},
        },
    }


def trials_of(c: Any, name: str) -> set[str]:
    """The sweep's trial TrainingJobs not being deleted (a deleted one waits for its finalizer a moment)."""
    return {o["metadata"]["name"] for o in (c.get(TJ, n) for n in c.names(TJ)) if o is not None
            and (o["metadata"].get("labels") or {}).get(LABEL_SWEEP) == name
            and not o["metadata"].get("deletionTimestamp")}


@pytest.mark.asyncio
@pytest.mark.services
@pytest.mark.slow
async def test_a_sweep_runs_its_trials_stops_losers_copies_the_best_and_cleans_up(
        cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("sweep")
    out = tmp_path / "out"
    doc = sweep_doc(name, movielens_dir, redis_url, amqp_url, out)
    async with launched(cluster_factory, tmp_path, doc) as job:
        c = job.c
        created: set[str] = set()

        def watch_trials() -> bool:
            # Owned by the sweep, labelled with it, never more at once than maxConcurrentTrials.
            sweep = c.get(SWEEPS, name)
            live = trials_of(c, name)
            for trial in live:
                refs = c.get(TJ, trial)["metadata"].get("ownerReferences") or []
                assert any(r["uid"] == sweep["metadata"]["uid"] and r["kind"] == "TrainingSweep" for r in refs)
            running = [t for t in live if (c.get(TJ, t).get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            assert len(running) <= 1, running
            created.update(live)
            return (sweep.get("status") or {}).get("phase") == "Succeeded"

        await job.until(watch_trials, "the sweep to finish")
        status = c.get(SWEEPS, name)["status"]
        rows = {row["name"]: row for row in status["trials"]}
        assert created == set(rows) and status["trialsCreated"] == 3
        stopped = [row for row in rows.values() if row["state"] == "Stopped"]
        assert stopped and all(row["killedAt"] < MAX_STEPS for row in stopped), rows
        assert all(n not in trials_of(c, name) for n in (row["name"] for row in stopped))  # the losers were deleted
        best = rows[status["bestTrial"]]
        assert best["state"] == "Succeeded"
        assert best["bestValidationLoss"] == min(r["bestValidationLoss"] for r in rows.values())
        assert status["bestModelURI"] == f"{out}/best/model.npz" and (out / "best" / "model.npz").is_file()
        assert (out / "best" / "summary.json").read_text() == (out / "trials" / best["name"] / "summary.json").read_text()

        code, _ = await c.call("DELETE", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingsweeps/{name}")
        assert code in (200, 202)
        await job.until(lambda: not trials_of(c, name) and c.get(SWEEPS, name) is None, "the trials to be deleted")


@pytest.mark.asyncio
@pytest.mark.services
async def test_the_operator_counts_asha_rungs_in_epochs_from_the_trials_status(
        cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    """`earlyStopping.resource: epochs`: rungs at epochs 1, 2, 4, 8 of each trial's `status.epoch`, below the trial's own
    maxEpochs; a loser at rung 0 is deleted; a trial seen at its maxEpochs is ending by itself and is not judged."""
    name = unique("epochs")
    doc = sweep_doc(name, movielens_dir, redis_url, amqp_url, tmp_path / "out")
    doc["spec"]["template"]["spec"]["stop"] = {"maxSteps": 100000, "maxEpochs": 10}
    doc["spec"] |= {"maxConcurrentTrials": 3,
                    "earlyStopping": {"type": "asha", "resource": "epochs", "minResource": 1, "reductionFactor": 2}}
    first, loser, ending = (f"{name}-{i}" for i in (1, 2, 3))
    async with cluster_factory() as c, running_operator():
        code, answer = await c.call("POST", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingsweeps", doc)
        assert code == 201, answer
        await c.until(lambda: trials_of(c, name) == {first, loser, ending}, "the three trials")

        def row(trial: str) -> dict[str, Any]:
            return next(r for r in (c.get(SWEEPS, name).get("status") or {}).get("trials", []) if r["name"] == trial)

        # Many steps but under an epoch: no rung yet (a step count would have passed rungs 0 to 4).
        await c.patch_job(first, {"status": {"step": 90, "epoch": 0.9, "validationLoss": 0.9}}, "/status")
        await c.until(lambda: row(first).get("bestValidationLoss") == 0.9, "the first trial's loss in the table")
        assert not row(first).get("rungLosses"), row(first)
        await c.patch_job(first, {"status": {"step": 110, "epoch": 1.1}}, "/status")
        await c.until(lambda: row(first).get("rungLosses") == [0.9] and row(first)["rung"] == 1,
                      "the first trial past rung 0 (the first at a rung goes on)")
        await c.patch_job(loser, {"status": {"step": 110, "epoch": 1.1, "validationLoss": 1.5}}, "/status")
        await c.until(lambda: row(loser)["state"] == "Stopped", "the loser stopped at rung 0")
        assert row(loser)["stopReason"] == STOP_ASHA.format(rung=0) and row(loser)["killedAt"] == 110
        assert loser not in trials_of(c, name)
        # At its maxEpochs with a loss that loses at every rung: the pass that records its rungs (8 < 10, so four)
        # would stop it, and the row shows that pass's judgement with them.
        await c.patch_job(ending, {"status": {"step": 1000, "epoch": 10.0, "validationLoss": 2.0}}, "/status")
        await c.until(lambda: row(ending).get("rungLosses") == [2.0] * 4, "the ending trial's rungs")
        assert row(ending)["state"] == "Running" and ending in trials_of(c, name), row(ending)
        assert "NoOutput" not in c.events(name, kind=SWEEP_KIND)  # it has spec.output.uri


@pytest.mark.asyncio
@pytest.mark.services
async def test_a_sweep_without_an_output_uri_is_warned_that_its_trials_records_go_with_them(
        cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("nowhere")
    doc = sweep_doc(name, movielens_dir, redis_url, amqp_url, tmp_path / "out")
    del doc["spec"]["output"]
    async with cluster_factory() as c, running_operator():
        code, answer = await c.call("POST", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingsweeps", doc)
        assert code == 201, answer
        await c.until(lambda: "NoOutput" in c.events(name, kind=SWEEP_KIND), "the NoOutput warning")
        assert c.events(name, kind=SWEEP_KIND)["NoOutput"] == NO_OUTPUT
        await c.until(lambda: trials_of(c, name) == {f"{name}-1"}, "its first trial, started all the same")

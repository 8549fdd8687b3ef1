"""TrainingSweeps: trial TrainingJobs owned by the sweep, at most maxConcurrentTrials at once, losers stopped by ASHA.

Each pass (on creation and then on a timer) reads the trials' TrainingJob statuses into the sweep's trials table
(`mlless.sweep.status`), judges them with ASHA (`mlless.sweep.asha`, whose state is the table itself, so a
restarted operator goes on where it was), deletes the losers (their supervisor ends the job cleanly on SIGTERM and
exports its model to output.uri), starts pending trials in free slots, and writes the status. The trials are owned by
the sweep (ownerReferences), so deleting it deletes them; the cleanup handler also deletes them by label, for API
servers without garbage collection. ASHA's resource is read from each trial's TrainingJob status, its `step` or
`epoch` as `earlyStopping.resource` says, and the rungs it reached are kept in the trial's row (`asha.reach`).
"""
from __future__ import annotations

from typing import Any, Mapping

import kopf

from mlless.contract import (
    API_VERSION, KIND, LABEL_SWEEP, STOP_ASHA, STOP_SWEEP_BUDGET, SWEEP_KIND, TERMINAL_JOB_PHASES,
)
from mlless.spec import SpecError
from mlless.sweep.asha import judge, reach
from mlless.sweep.manifest import EarlyStopping, Sweep, sweep_from_manifest
from mlless.sweep.status import Trial, best_trial, copy_record, sweep_status
from mlless_operator.kubeapi import KubeAPI

#: Without an output URI a trial's model and record live only in its supervisor pod, which goes with its TrainingJob:
#: the losers ASHA stops are deleted at once, and the best trial's model is not copied anywhere.
NO_OUTPUT = ("spec.output.uri is not set: each trial's model and record stay in its supervisor pod and go with its "
             "TrainingJob (a trial ASHA stops is deleted at once), and the best model is not copied")


def _sweep(body: Mapping[str, Any]) -> Sweep:
    meta = body["metadata"]
    doc = {"apiVersion": API_VERSION, "kind": SWEEP_KIND, "metadata": {"name": meta["name"]},
           "spec": dict(body.get("spec") or {})}
    return sweep_from_manifest(doc, None, f"{meta.get('namespace')}/{meta['name']}")


def trial_job(sweep: Sweep, trial: Trial, body: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's TrainingJob: the template with its values, labelled with and owned by the sweep."""
    meta = body["metadata"]
    job = sweep.trial_manifest(trial.name, trial.parameters)
    job["metadata"] |= {
        "namespace": meta["namespace"],
        "labels": {LABEL_SWEEP: meta["name"]},
        "ownerReferences": [{"apiVersion": API_VERSION, "kind": SWEEP_KIND, "name": meta["name"], "uid": meta["uid"],
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if sweep.output_uri:  # each trial's record, where the best one is copied from
        job["spec"]["output"] = {"uri": f"{sweep.output_uri.rstrip('/')}/trials/{trial.name}"}
    return job


def _observe(trial: Trial, job: Mapping[str, Any] | None, rule: EarlyStopping, limit: float | None) -> float:
    """Take a running trial's TrainingJob status into its row; the steps or epochs (`rule.field`) it reached."""
    if job is None:  # deleted by someone else
        trial.state, trial.stop_reason = "Failed", trial.stop_reason or "its TrainingJob was deleted"
        return 0.0
    status = job.get("status") or {}
    trial.step = status.get("step", trial.step)
    trial.cost_usd = status.get("costUSD", trial.cost_usd)
    trial.observe_loss(status.get("validationLoss"))
    reached = float(status.get(rule.field) or 0)
    if rule.enabled and trial.best_validation_loss is not None:
        reach(rule, trial.rung_losses, reached, trial.best_validation_loss, limit)
    if status.get("phase") in TERMINAL_JOB_PHASES:
        trial.state = status["phase"]
        trial.stop_reason = status["phase"]
        trial.model_uri = status.get("modelURI")
    return reached


async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    api: KubeAPI = memo.api
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    # The sweep as it is now, not as the event that woke this timer saw it: the trials table is the state this pass
    # goes on from, and a stale one would start a trial again, or forget one ASHA stopped.
    current = await api.get(API_VERSION, SWEEP_KIND, namespace, name)
    if current is None:
        return
    status = current.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return

    async def write(new_status: dict[str, Any]) -> None:
        await api.patch(API_VERSION, SWEEP_KIND, namespace, name, {"status": new_status}, subresource="status")

    try:
        sweep = _sweep(current)
    except SpecError as exc:
        await write({"phase": "Failed", "message": str(exc)})
        kopf.warn(dict(body), reason="InvalidSpec", message=str(exc))
        return
    if status.get("trials"):
        trials = [Trial.from_status(row) for row in status["trials"]]
    else:  # the first pass
        if not sweep.output_uri:
            kopf.warn(dict(body), reason="NoOutput", message=NO_OUTPUT)
        trials = [Trial(sweep.trial_name(i), values) for i, values in enumerate(sweep.assignments())]
    rule = sweep.early_stopping
    ending: set[str] = set()  # trials seen at their own limit (maxSteps or maxEpochs, as ASHA counts)
    for trial in trials:
        if trial.state == "Running":
            limit = sweep.trial_limit(trial.name, trial.parameters)
            reached = _observe(trial, await api.get(API_VERSION, KIND, namespace, trial.name), rule, limit)
            if limit is not None and reached >= limit:
                ending.add(trial.name)
    if rule.enabled:
        progress = [t.progress() for t in trials]
        for seen in progress:
            # A trial seen at its own limit is ending by itself: stopping it would save nothing, and would record
            # as killed a trial that ran to the end (its status can reach the limit between two passes).
            seen.running = seen.running and seen.name not in ending
        for loser, rung in judge(rule, progress).items():
            trial = next(t for t in trials if t.name == loser)
            await api.delete(API_VERSION, KIND, namespace, loser)
            trial.state, trial.killed_at, trial.stop_reason = "Stopped", trial.step, STOP_ASHA.format(rung=rung)
            kopf.info(dict(body), reason="TrialStopped", message=f"{loser} at step {trial.step} (ASHA rung {rung})")
        for trial, seen in zip(trials, progress):
            trial.rung = seen.passed
    spent = sum(t.cost_usd for t in trials)
    over_budget = sweep.budget_usd is not None and spent >= sweep.budget_usd
    message = f"budget spent: ${spent:.5f} of ${sweep.budget_usd:g}" if over_budget else None
    if over_budget:
        for trial in trials:
            if trial.state == "Running":
                await api.delete(API_VERSION, KIND, namespace, trial.name)
                trial.state, trial.killed_at, trial.stop_reason = "Stopped", trial.step, STOP_SWEEP_BUDGET
    running = sum(t.state == "Running" for t in trials)
    for trial in trials:
        if over_budget or running >= sweep.max_concurrent:
            break
        if trial.state == "Pending":
            await api.create(trial_job(sweep, trial, current))
            trial.state, running = "Running", running + 1
    done = running == 0 and (over_budget or all(t.state != "Pending" for t in trials))
    new_status = sweep_status("Succeeded" if done else "Running", trials, message)
    best = best_trial(trials)
    if done and best is not None and sweep.output_uri and best.model_uri:
        new_status["bestModelURI"] = copy_record(best.model_uri.rsplit("/", 1)[0],
                                                 f"{sweep.output_uri.rstrip('/')}/best")
    await write(new_status)


async def cleanup(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Delete the sweep's trials: what the garbage collector does through their owner references, done here too."""
    api: KubeAPI = memo.api
    meta = body["metadata"]
    for job in await api.list(API_VERSION, KIND, meta["namespace"], {LABEL_SWEEP: meta["name"]}):
        await api.delete(API_VERSION, KIND, meta["namespace"], job["metadata"]["name"], job["metadata"].get("uid"))

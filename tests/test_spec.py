"""The TrainingJob schema and its typed form: field-path errors, defaults, and the JSON round trip."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from mlless.spec import SpecError, TrainingJob, from_manifest, load_manifest, manifest_schema
from mlless.spec.models import PAPERS_V, PMF_V, model_type
from mlless.spec.schema import DEFAULT_PATIENCE
from mlless.stopping.rules import StopRules

MINIMAL = {
    "apiVersion": "mlless.io/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "movielens"},
    "spec": {"workers": 3, "model": {"type": "pmf"}, "dataset": {"uri": "/data/ml"}},
}


def with_spec(**changes) -> dict:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"].update(changes)
    return doc


def test_minimal_manifest_gets_the_defaults():
    job = from_manifest(MINIMAL)
    assert job.workers == 3
    assert job.model.type == "pmf" and job.model.options["rank"] == 20
    assert job.optimizer.type == "adagrad" and job.optimizer.learning_rate == pytest.approx(0.4 / 3)  # P = 3
    assert job.sync.protocol == "blocked" and job.sync.significance_threshold == pytest.approx(3.0)  # PMF's v
    # a job with no limit stops when validation stops improving, and ends even if it never does
    assert job.stop.patience == 5 and job.stop.max_epochs == 50
    assert job.pricing.price_per_gb_second == pytest.approx(1.7e-5)


@pytest.mark.parametrize("stop", [{}, {"maxSteps": 10}, {"maxEpochs": 2}, {"maxSeconds": 30}, {"targetLoss": 0.9},
                                  {"budgetUSD": 0.01}])
def test_patience_is_on_by_default_with_every_limit(stop):
    """A limit is a budget, not a wish to train that long: early stopping stays on beside it (issue #47)."""
    assert from_manifest(with_spec(stop=stop)).stop.patience == DEFAULT_PATIENCE > 0
    assert from_manifest(with_spec(stop={**stop, "patience": 2})).stop.patience == 2
    off = from_manifest(with_spec(stop={**stop, "patience": 0}))
    assert off.stop.patience == 0 and from_manifest(off.to_manifest()) == off  # off survives the round trip
    assert StopRules(off.stop, evaluate_every=25).watch.patience is None  # 0 is off, not "stop at once"
    with pytest.raises(SpecError, match="spec.stop.patience"):
        from_manifest(with_spec(stop={**stop, "patience": -1}))


@pytest.mark.parametrize(("workers", "lr"), [(1, 0.2), (2, 0.2), (4, 0.1), (8, 0.05)])
def test_pmf_default_learning_rate_follows_the_workers(workers, lr):
    assert from_manifest(with_spec(workers=workers)).optimizer.learning_rate == pytest.approx(lr)
    assert from_manifest(with_spec(workers=workers, optimizer={"learningRate": 0.3})).optimizer.learning_rate == 0.3


def test_papers_optimizers_stay_selectable():
    job = from_manifest(with_spec(optimizer={"type": "nesterov", "learningRate": 4.0, "momentum": 0.8}))
    assert job.optimizer.type == "nesterov" and job.optimizer.learning_rate == 4.0


@pytest.mark.parametrize("kind", ["logistic-regression", "svm", "linear-regression"])
def test_the_linear_family_defaults_to_the_normalized_updates_at_vws_rate(kind):
    job = from_manifest(with_spec(model={"type": kind}))
    assert (job.optimizer.type, job.optimizer.learning_rate, job.optimizer.lr_decay) == ("normalized", 0.5, "none")


def test_bsp_and_ssp_send_every_entry():
    from mlless.sync import sync_strategy

    assert sync_strategy(from_manifest(with_spec(sync={"protocol": "bsp"})).sync).threshold == 0
    ssp = sync_strategy(from_manifest(with_spec(sync={"protocol": "ssp", "slack": 2})).sync)
    assert ssp.threshold == 0 and ssp.staleness == 2
    assert sync_strategy(from_manifest(with_spec(sync={"protocol": "isp"})).sync).staleness == 0


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"workers": 0}, "spec.workers"),
        ({"model": {"type": "no-such-model"}}, "spec.model.type"),
        ({"model": {"type": "pmf", "rank": "big"}}, "spec.model.rank"),
        ({"model": {"type": "pmf", "rnak": 3}}, "spec.model"),
        ({"optimizer": {"learningRate": -1}}, "spec.optimizer.learningRate"),
        ({"sync": {"protocol": "isp", "significanceThreshold": -0.1}}, "spec.sync.significanceThreshold"),
        ({"stop": {"maxSteps": 0}}, "spec.stop.maxSteps"),
        ({"dataset": {}}, "spec.dataset"),
    ],
)
def test_invalid_field_is_named(change, path):
    with pytest.raises(SpecError) as err:
        from_manifest(with_spec(**change))
    assert path in str(err.value)


def test_wrong_kind_and_api_version_are_rejected():
    for key, value in (("kind", "Job"), ("apiVersion", "v1")):
        doc = copy.deepcopy(MINIMAL)
        doc[key] = value
        with pytest.raises(SpecError, match=key):
            from_manifest(doc)


def test_load_manifest_resolves_relative_dataset_and_reports_bad_yaml(tmp_path: Path):
    good = tmp_path / "job.yaml"
    good.write_text(yaml.safe_dump(with_spec(dataset={"uri": "data/ml"})))
    assert load_manifest(good).dataset_uri == str(tmp_path / "data/ml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_manifest(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_manifest(tmp_path / "missing.yaml")


def test_resolved_job_round_trips_through_json():
    job = from_manifest(with_spec(stop={"targetLoss": 0.9, "maxSeconds": 60}, sync={"protocol": "ssp", "slack": 1}))
    assert TrainingJob.from_json(job.to_json()) == job


@pytest.mark.parametrize("example", sorted(p for p in Path(__file__).parent.parent.joinpath("examples").glob("*.yaml")
                                           if not p.name.startswith("sweep-")),  # TrainingSweeps: test_sweep.py
                         ids=lambda p: p.name)
def test_a_resolved_job_is_the_manifest_it_resolves(example):
    job = load_manifest(example)
    assert from_manifest(job.to_manifest()) == job


@pytest.mark.parametrize("field, value, path", [
    ("workers", 0, "spec.workers"), ("seed", -1, "spec.seed"), ("supervisor_timeout_seconds", 1, "spec.liveness"),
    ("name", "Not_A_Name", "metadata.name"), ("dataset_uri", 7, "spec.dataset.uri"),
])
def test_a_resolved_job_with_a_value_no_manifest_could_have_is_refused(field, value, path):
    doc = json.loads(from_manifest(with_spec()).to_json())
    with pytest.raises(SpecError, match=rf"^resolved job: invalid TrainingJob; {re.escape(path)}"):
        TrainingJob.from_json(json.dumps({**doc, field: value}))


def test_structural_schema_has_no_additional_properties_but_cli_schema_forbids_unknown():
    def walk(node):
        yield node
        for child in node.get("properties", {}).values():
            yield from walk(child)

    loose = manifest_schema(strict=False)["properties"]["spec"]
    assert all("additionalProperties" not in n for n in walk(loose))
    assert all("type" in n for n in walk(loose))
    strict = manifest_schema(strict=True)["properties"]["spec"]
    assert strict["additionalProperties"] is False


def _defaults(node, path=()):
    if "default" in node:
        yield ".".join(path), node
    for name, child in node.get("properties", {}).items():
        yield from _defaults(child, (*path, name))


def test_every_schema_default_is_valid_for_its_own_field():
    import jsonschema

    from mlless.spec import SPEC_SCHEMA

    found = dict(_defaults(SPEC_SCHEMA))
    assert {"workers", "sync.slack", "autoscaler.knee.slope", "pricing.redisPerHour"} <= set(found)
    for path, node in found.items():
        jsonschema.Draft4Validator({k: v for k, v in node.items() if k != "default"}).validate(node["default"])


def test_the_isp_threshold_defaults_by_model_type_and_a_given_one_wins():
    lr = from_manifest(with_spec(model={"type": "logistic-regression"}))
    assert lr.sync.significance_threshold == PAPERS_V and from_manifest(MINIMAL).sync.significance_threshold == PMF_V
    given = from_manifest(with_spec(sync={"protocol": "isp", "significanceThreshold": 1.5}))
    assert (given.sync.protocol, given.sync.significance_threshold) == ("isp", 1.5)
    assert TrainingJob.from_json(given.to_json()).sync == given.sync


def test_a_minimal_manifest_resolves_to_the_schema_defaults(tmp_path):
    from mlless.spec.schema import default

    job = from_manifest({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                         "spec": {"model": {"type": "pmf"}, "dataset": {"uri": str(tmp_path)}}})
    assert (job.workers, job.seed, job.model.options["rank"], job.evaluate_every) == (
        default("workers"), default("seed"), default("model.rank"), default("evaluation.everySteps"))
    assert (job.sync.protocol, job.sync.significance_threshold, job.sync.slack) == (
        model_type("pmf").protocol, PMF_V, default("sync.slack"))
    assert job.autoscaler.knee.slope == default("autoscaler.knee.slope")
    assert job.pricing.redis_per_hour == default("pricing.redisPerHour")

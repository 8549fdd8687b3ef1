"""The TrainingJob dataclasses take their field names from the schema: camelCase there, snake_case here."""
from __future__ import annotations

import dataclasses

import pytest

from mlless.spec import TrainingJob
from mlless.spec.config import KneeConfig, ModelConfig, OptimizerConfig, PricingConfig, StopConfig, SyncConfig, TunerConfig
from mlless.spec.job import _snake_case
from mlless.spec.models import BUILT_IN
from mlless.spec.schema import default, model_fields, schema_field

SECTIONS = {
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "sync": SyncConfig,
    "stop": StopConfig,
    "pricing": PricingConfig,
    "autoscaler": TunerConfig,
    "autoscaler.knee": KneeConfig,
}


@pytest.mark.parametrize("camel, snake", [("budgetUSD", "budget_usd"), ("pricePerGBSecond", "price_per_gb_second"),
                                          ("functionMemoryGB", "function_memory_gb"), ("beta1", "beta1"),
                                          ("lrDecay", "lr_decay"), ("type", "type")])
def test_snake_case_keeps_acronyms_whole(camel, snake):
    assert _snake_case(camel) == snake


@pytest.mark.parametrize("path", SECTIONS)
def test_every_schema_field_of_a_section_names_a_field_of_its_dataclass(path):
    fields = {f.name for f in dataclasses.fields(SECTIONS[path])}
    # The fields model types declare (rank, clusters) are the model's options, not dataclass fields.
    declared = model_fields(BUILT_IN) if path == "model" else {}
    assert {_snake_case(key) for key in schema_field(path)["properties"] if key not in declared} <= fields


def test_a_model_config_holds_its_types_declared_fields_with_their_defaults_and_no_others():
    assert ModelConfig("pmf").options == {"rank": default("model.rank")}
    assert ModelConfig.of("kmeans", rank=5, clusters=3).options == {"clusters": 3}
    assert ModelConfig.of("logistic-regression", rank=5).options == {}
    with pytest.raises(ValueError, match="spec.model.clusters: 0 is less than the minimum of 1"):
        ModelConfig.of("kmeans", clusters=0)


def test_training_job_fields_read_from_the_spec_default_to_the_schema():
    read = [f for f in dataclasses.fields(TrainingJob) if "spec" in f.metadata]
    assert read
    for f in read:
        assert f.default == default(f.metadata["spec"]), f.name

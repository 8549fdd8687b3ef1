"""The TrainingJob specification: one schema for the CLI and the CRD, and its typed form."""
from mlless.spec.config import PricingConfig, StopConfig, SyncConfig
from mlless.spec.job import (
    SpecError,
    TrainingJob,
    from_manifest,
    load_manifest,
    validate_manifest,
)
from mlless.spec.schema import SPEC_SCHEMA, manifest_schema

__all__ = [
    "SPEC_SCHEMA",
    "PricingConfig",
    "SpecError",
    "StopConfig",
    "SyncConfig",
    "TrainingJob",
    "from_manifest",
    "load_manifest",
    "manifest_schema",
    "validate_manifest",
]

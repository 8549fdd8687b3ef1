"""ConfigMap `NAME-job`: the TrainingJob manifest the supervisor and worker pods read (MLLESS_JOB_FILE)."""
from __future__ import annotations

import copy

import yaml

from mlless.contract import API_VERSION, KIND
from mlless_operator.builders.jobref import JobRef, Manifest
from mlless_operator.builders.names import configmap_name, metadata

JOB_DIR = "/etc/mlless"
JOB_FILE = f"{JOB_DIR}/job.yaml"


def job_manifest(job: JobRef) -> Manifest:
    """The manifest the runtime reads (`mlless.spec.from_manifest` accepts and ignores the cluster fields)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": job.name}, "spec": copy.deepcopy(dict(job.spec))}


def build_job_configmap(job: JobRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, configmap_name(job), "job"),
        "data": {"job.yaml": yaml.safe_dump(job_manifest(job), sort_keys=False)},
    }

"""Names shared across process and package boundaries, each written once.

The CLI, the worker and supervisor processes, the function server and the
operator agree on these names without importing one another: the CRD's
identity, the environment variables that configure a process, the labels on
the job's children, the phase names of a step and of a job, why a job stops, and the
codes a process exits with. This module
imports nothing, so anything may import it.
"""

# --- The TrainingJob custom resource -------------------------------------------------------------------------
GROUP = "mlless.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAME = "tj"
#: The TrainingSweep: trials of one TrainingJob template over a search space (functions/mlless/spec/sweep.py).
SWEEP_KIND = "TrainingSweep"
SWEEP_PLURAL = "trainingsweeps"
SWEEP_SINGULAR = "trainingsweep"
SWEEP_SHORT_NAME = "tsw"
#: A local sweep directory (`mlless sweep`, read by `mlless report`): its status (the TrainingSweep's status object),
#: the resolved sweep it ran, one run directory per trial, and the best trial's model and record.
SWEEP_STATUS_FILE = "status.json"
SWEEP_FILE = "sweep.json"
SWEEP_TRIALS_DIR = "trials"
SWEEP_BEST_DIR = "best"

# --- Labels and annotations on a job's children ----------------------------------------------------------------
LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_RANK = f"{GROUP}/rank"
ANNOTATION_BACKEND = f"{GROUP}/backend"
ANNOTATION_OWNER = f"{GROUP}/owner"
ANNOTATION_OWNER_UID = f"{GROUP}/owner-uid"
#: On a sweep's trial TrainingJob: the sweep that made it.
LABEL_SWEEP = f"{GROUP}/sweep"
#: On a TrainingJob (pod backend): the highest worker rank created in the current session, so that no rank is
#: ever reused even after its pod is gone without a trace in status.removedRanks (a user's scale-in).
ANNOTATION_HIGHEST_RANK = f"{GROUP}/highest-rank"
#: On a supervisor pod: how many restarts (spec.backoffLimit) came before it, 0 for the first; the live pod carries the
#: count even if the operator stopped before writing it into status.supervisorRestarts.
ANNOTATION_SUPERVISOR_RESTART = f"{GROUP}/supervisor-restart"

# --- Environment variables: one name per setting ----------------------------------------------------------------
#: Service URLs (a password may come separately, see the *_PASSWORD names).
ENV_REDIS_URL = "REDIS_URL"
ENV_AMQP_URL = "AMQP_URL"
ENV_REDIS_PASSWORD = "REDIS_PASSWORD"
ENV_RABBITMQ_PASSWORD = "RABBITMQ_PASSWORD"
#: PEM bundle of the CA that signs a TLS service's certificate (rediss://, amqps://), trusted besides the system's.
ENV_REDIS_CA_FILE = "MLLESS_REDIS_CA_FILE"
ENV_RABBITMQ_CA_FILE = "MLLESS_RABBITMQ_CA_FILE"
#: Those two by service, as a TrainingJob's spec names the services (spec.redis, spec.rabbitmq).
CA_FILE_VARS = {"redis": ENV_REDIS_CA_FILE, "rabbitmq": ENV_RABBITMQ_CA_FILE}
#: The embedded broker's address, for a laptop run's worker processes.
ENV_EMBEDDED_ADDRESS = "MLLESS_EMBEDDED_ADDRESS"
#: Which job and which replica a process is.
ENV_JOB_ID = "MLLESS_JOB_ID"
ENV_JOB_FILE = "MLLESS_JOB_FILE"
ENV_JOB_NAME = "MLLESS_JOB_NAME"
ENV_JOB_NAMESPACE = "MLLESS_JOB_NAMESPACE"
ENV_RANK = "MLLESS_RANK"
#: A worker invocation: continue from its checkpoint, and when to checkpoint and return.
ENV_RESUME = "MLLESS_RESUME"
ENV_DEADLINE_SECONDS = "MLLESS_DEADLINE_SECONDS"
ENV_FUNCTION_TIMEOUT_SECONDS = "MLLESS_FUNCTION_TIMEOUT_SECONDS"
#: How the supervisor reaches its workers on a cluster.
ENV_WORKER_BACKEND = "MLLESS_WORKER_BACKEND"
ENV_WORKER_URL = "MLLESS_WORKER_URL"
#: The shared secret of a job's function invocations, given directly or as a file under the secrets folder.
ENV_INVOKE_TOKEN = "MLLESS_INVOKE_TOKEN"
ENV_SECRETS_DIR = "MLLESS_SECRETS_DIR"
#: The process's own identity (mlless.protocol.identity), given directly or as the file `identity` under the secrets
#: folder: every frame the process writes to Redis or RabbitMQ carries its signature.
ENV_IDENTITY = "MLLESS_IDENTITY"
ENV_METRICS_PORT = "MLLESS_METRICS_PORT"
#: How long Redis's and RabbitMQ's clients wait out an outage before the process gives up (seconds).
ENV_OUTAGE_SECONDS = "MLLESS_OUTAGE_SECONDS"
#: Debugging: check that every update applied is conserved across replicas.
ENV_AUDIT = "MLLESS_AUDIT"
#: `mlless train --attack RANK=KIND`: the worker of that rank publishes attacked updates (runtime/attack.py).
ENV_ATTACK = "MLLESS_ATTACK"
#: Sync strategies, exchange patterns and model types defined outside the package: Python files or module names,
#: comma-separated, that each process imports so that they register themselves (functions/mlless/plugins.py).
ENV_PLUGINS = "MLLESS_PLUGINS"
#: Debugging: 0 starts each local worker as a new `python -m mlless worker`, not as a fork of a warm zygote
#: (functions/mlless/launch/zygote.py).
ENV_ZYGOTE = "MLLESS_ZYGOTE"
#: The cores a worker function may compute on: its CPU request, rounded up to whole cores. The operator sets it on
#: every backend's workers (a pod's affinity shows the node's cores, not its share); a network's worker runs as many
#: torch threads (functions/mlless/training/models/network.py, `torch_threads`).
ENV_CPU_CORES = "MLLESS_CPU_CORES"
#: The operator's settings are the fields of `mlless_operator.config.Config`, upper-cased, after this prefix.
ENV_OPERATOR_PREFIX = "MLLESS_OPERATOR_"

# --- Phases ---------------------------------------------------------------------------------------------------
#: A worker's step, in pipeline order; reports, metrics and plots carry its timings in this order.
STEP_PHASES = ("fetch", "compute", "filter", "write", "wait", "read", "apply")
#: The phases after a worker's own update is written: waiting for the step-close, reading peers' updates and
#: applying them. They end after the step's report is sent, so a report carries them for the step before it.
BARRIER_PHASES = ("wait", "read", "apply")
#: A TrainingJob's status.phase values after which nothing runs again.
TERMINAL_JOB_PHASES = ("Succeeded", "Failed")

# --- Stop reasons: a run's summary.json "stop_reason", a sweep trial's status "stopReason" -----------------------
#: The rules of spec.stop (functions/mlless/stopping/rules.py), in the order they are checked.
STOP_TARGET_LOSS = "target loss reached"
STOP_NO_IMPROVEMENT = "validation loss stopped improving"
STOP_MAX_STEPS = "max steps"
STOP_MAX_EPOCHS = "max epochs"
STOP_MAX_SECONDS = "max seconds"
STOP_BUDGET = "budget reached"
#: The validation loss diverged: a failure (`mlless train` exits non-zero), the model is the best snapshot.
STOP_DIVERGED = "diverged"
#: The platform asked for a suspend (spec.suspend): the job checkpoints, to resume from it later.
STOP_SUSPENDED = "suspended"
#: Every worker was dropped: a failure, even if a best snapshot was saved.
STOP_NO_LIVE_WORKERS = "no live workers"
#: Redis or RabbitMQ stayed out of reach past the transport's retries; the error follows it.
STOP_SERVICE_LOST = "service lost"
#: Ctrl-C or SIGTERM.
STOP_INTERRUPTED = "interrupted"
#: The supervisor itself failed unexpectedly (a bug, or input no check caught); the error follows it.
STOP_INTERNAL_ERROR = "internal error"
#: A sweep stopped the trial: ASHA at a rung (`.format(rung=...)`), the sweep's budget, or an interrupted sweep.
STOP_ASHA = "stopped by the sweep: ASHA rung {rung}"
STOP_SWEEP_BUDGET = "stopped by the sweep: its budget is spent"
STOP_SWEEP_INTERRUPTED = "stopped by the sweep: interrupted"

# --- Exit codes ---------------------------------------------------------------------------------------------------
#: A command or job failed: a service was lost, no live worker was left, a stop rule ended it as failed.
EXIT_FAILED = 1
#: Bad input (a manifest, a dataset, a command-line argument): the message names it.
EXIT_USAGE = 2
#: `mlless worker` exits with this code after a checkpoint, or after handing over to a new supervisor
#: (EX_TEMPFAIL: "invoke me again"; a pod's container is restarted on it).
EXIT_CHECKPOINTED = 75
#: Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130

# --- Ports and the function timeout ---------------------------------------------------------------------------
#: Where a worker function's HTTP server (`mlless worker-server`) listens.
FUNCTION_PORT = 8080
#: The supervisor's Prometheus metrics port (MLLESS_METRICS_PORT's default).
SUPERVISOR_METRICS_PORT = 9090
#: The operator's liveness endpoint (`/healthz`); charts/mlless/values.yaml's operator.healthPort repeats it.
OPERATOR_HEALTH_PORT = 8080
#: How long a worker invocation may run by default (Knative's default revision timeout).
FUNCTION_TIMEOUT_SECONDS = 300

# --- How the supervisor reaches its workers ---------------------------------------------------------------------
#: Set on the supervisor pod by the operator, from the job's backend: one of the WORKER_INVOCATION_* kinds.
ENV_WORKER_INVOCATION = "MLLESS_WORKER_INVOCATION"
#: The supervisor invokes each rank over HTTP at MLLESS_WORKER_URL, again after each checkpointed return.
WORKER_INVOCATION_HTTP = "http"
#: Someone else (the operator) starts the workers; the supervisor waits for them to join.
WORKER_INVOCATION_EXTERNAL = "external"

# --- The precisions update values travel in -------------------------------------------------------------------
#: `spec.sync.precision`'s values (`mlless.spec.sync_fields`), the first the default; `mlless.protocol.precision`
#: has their codecs.
PRECISIONS = ("float32", "float16", "bfloat16")


# --- A sharded Redis's URLs in one string (REDIS_URL, the job Secret's redis-url) --------------------------------
def joined_shard_urls(urls: list[str]) -> str:
    """Several Redis shards' URLs as one REDIS_URL: separated by spaces (no URL holds a raw space)."""
    return " ".join(urls)


def shard_urls(redis_url: str) -> list[str]:
    """The shards' URLs a REDIS_URL holds (`joined_shard_urls`): one, or several."""
    return redis_url.split()

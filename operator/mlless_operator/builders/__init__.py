"""Pure builders: each returns one manifest dict for a child of a TrainingJob.

Nothing here talks to the API server, so every object is unit-tested and
validated offline (`tests/operator/test_builders.py`). `jobref.JobRef` carries
what every builder needs about the job instead of a long parameter list.

Children of job NAME in namespace NS, by module:

- `credentials`: Secret `NAME-credentials`, generated Redis and RabbitMQ
  passwords and the full service URLs; pods read them through `secretKeyRef`,
  never literally;
- `jobfile`: ConfigMap `NAME-job`, the TrainingJob manifest the supervisor and
  worker pods read (MLLESS_JOB_FILE);
- `services`: Redis and RabbitMQ, StatefulSet + Service `NAME-redis` /
  `NAME-rabbitmq` (unless `spec.redis.url` / `spec.rabbitmq.url` names an external one);
- `network`: NetworkPolicy `NAME-services`, letting only the job's pods and the
  operator reach its managed Redis and RabbitMQ (unless the chart turns it off);
- `supervisor`: ServiceAccount, Role, RoleBinding, Pod and metrics Service `NAME-supervisor`.

The workers are the job's backend's, built in its module of `mlless_operator.backends`.

What they share: `names` (names, labels, owner references, ports), `podspec`
(security contexts, resources) and `runtime` (what the supervisor's and the
workers' containers have in common).
"""

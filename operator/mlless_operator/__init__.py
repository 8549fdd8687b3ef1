"""The mlless Kopf operator: turns a TrainingJob into Redis, RabbitMQ, a supervisor and worker functions."""

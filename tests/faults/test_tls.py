"""TLS end to end: a job over `rediss://` and `amqps://`, against a Redis and a RabbitMQ node of this module's own
that speak only TLS, with a certificate from a CA made here (the `openssl` CLI; `.ci/run` installs it).

The certificate names `localhost` only, so connecting to 127.0.0.1 checks that hostnames are verified. Each
service has a password of its own that must never show in the output or the run directory.
"""
from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from mlless.contract import ENV_RABBITMQ_CA_FILE, ENV_REDIS_CA_FILE, STOP_MAX_STEPS
from mlless.transport import TransportError, connect
from mlless.transport.admin import delete_job_keys
from mlless.transport.outage import CONNECT_SECONDS
from mlless.transport.tls import TrustedCA

from faults.conftest import RabbitNode, rabbit_node, redis_server
from faults.test_outages import finish, start_job

pytestmark = [pytest.mark.slow, pytest.mark.services]

REDIS_PASSWORD = f"redis-{secrets.token_hex(8)}"
AMQP_PASSWORD = f"amqp-{secrets.token_hex(8)}"
STEPS = 40


@dataclass(frozen=True)
class PKI:
    """PEM files: a CA, a server certificate it signs for `localhost` and its key, and an unrelated CA."""

    ca: str
    server: str
    server_key: str
    other_ca: str


def openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)


def new_key(folder: Path, name: str) -> list[str]:
    """`openssl req` arguments making a P-256 key (fast to generate) in `name`.pem."""
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.pem"]


@pytest.fixture(scope="module")
def pki() -> Iterator[PKI]:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is not installed (.ci/run installs it)")
    # Readable by the rabbitmq user: not under pytest's tmp_path (see conftest.rabbit_node). The keys are throwaway.
    folder = Path(tempfile.mkdtemp(prefix="mlless-pki-"))
    folder.chmod(0o755)
    for ca in ("ca", "other-ca"):
        openssl(folder, "req", "-x509", *new_key(folder, f"{ca}-key"), "-out", f"{ca}.pem", "-days", "2",
                "-subj", f"/CN=mlless test {ca}")
    openssl(folder, "req", *new_key(folder, "server-key"), "-out", "server.csr", "-subj", "/CN=localhost")
    (folder / "server.ext").write_text("subjectAltName = DNS:localhost\nextendedKeyUsage = serverAuth\n")
    openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-set_serial", "1",
            "-days", "2", "-extfile", "server.ext", "-out", "server.pem")
    for path in folder.iterdir():
        path.chmod(0o644)
    try:
        yield PKI(*(str(folder / f"{name}.pem") for name in ("ca", "server", "server-key", "other-ca")))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_redis(pki: PKI) -> Iterator[str]:
    """The URL of a Redis that listens with TLS only and wants a password."""
    with redis_server("--port", "0", "--tls-cert-file", pki.server, "--tls-key-file", pki.server_key,
                      "--tls-ca-cert-file", pki.ca, "--tls-auth-clients", "no", "--requirepass", REDIS_PASSWORD,
                      port_option="--tls-port") as port:
        yield f"rediss://:{REDIS_PASSWORD}@localhost:{port}/0"


@pytest.fixture(scope="module")
def tls_rabbit(pki: PKI) -> Iterator[RabbitNode]:
    """A RabbitMQ node that listens with TLS only, with the user `mlless`."""
    conf = "\n".join([
        "listeners.tcp = none",
        "listeners.ssl.local = 127.0.0.1:{port}",
        f"ssl_options.cacertfile = {pki.ca}",
        f"ssl_options.certfile = {pki.server}",
        f"ssl_options.keyfile = {pki.server_key}",
        "ssl_options.verify = verify_none",
        "ssl_options.fail_if_no_peer_cert = false",
    ])
    with rabbit_node(conf) as node:
        node.ctl("add_user", "mlless", AMQP_PASSWORD)
        node.ctl("set_permissions", "-p", "/", "mlless", ".*", ".*", ".*")
        yield node


@pytest.fixture(scope="module")
def tls_amqp(tls_rabbit: RabbitNode) -> str:
    return f"amqps://mlless:{AMQP_PASSWORD}@localhost:{tls_rabbit.port}/%2F"


def assert_no_password(*texts: str) -> None:
    for text in texts:
        assert REDIS_PASSWORD not in text and AMQP_PASSWORD not in text


def port_of(url: str) -> int:
    return urlsplit(url).port


def run_dir_text(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".npz")


def test_a_job_runs_over_rediss_and_amqps(pki, tls_redis, tls_amqp, tls_rabbit, movielens_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_job(movielens_dir, run_dir, tls_redis, tls_amqp, steps=STEPS,
                     env={ENV_REDIS_CA_FILE: pki.ca, ENV_RABBITMQ_CA_FILE: pki.ca})
    summary, err = finish(proc, run_dir)
    assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == STEPS
    assert summary["workers_final"] == 2 and summary["rejected_frames"] == 0
    assert tls_rabbit.queues() == []  # nothing leaked, over TLS as over plain AMQP
    client = redis.Redis.from_url(tls_redis, ssl_ca_certs=pki.ca)
    assert list(client.scan_iter("mlless:*")) == []
    client.close()
    assert_no_password(err, run_dir_text(run_dir))


def test_a_client_without_the_ca_is_refused_in_one_line(tls_redis, tls_amqp, movielens_dir, tmp_path):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    proc = start_job(movielens_dir, run_dir, tls_redis, tls_amqp, steps=STEPS)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err[-3000:]
    assert time.monotonic() - started < CONNECT_SECONDS + 10  # the first connection's window, plus start-up
    assert "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line == (f"mlless: error: redis rediss://:***@localhost:{port_of(tls_redis)}/0: TLS certificate not trusted (self-signed "
                    f"certificate in certificate chain); trusting the system's CAs only; set {ENV_REDIS_CA_FILE} to "
                    "the CA that signs it"), line
    assert_no_password(out, err)


@pytest.mark.parametrize(
    "host, redis_ca, amqp_ca, expected",
    [
        ("localhost", "other_ca", "ca", "redis rediss://:***@localhost:{redis_port}/0: TLS certificate not trusted "
         f"(self-signed certificate in certificate chain); trusting the system's CAs and {ENV_REDIS_CA_FILE}={{other_ca}}"),
        ("localhost", "ca", None, "amqp amqps://mlless:***@localhost:{amqp_port}/%2F: TLS certificate not trusted "
         "(self-signed certificate in certificate chain); trusting the system's CAs only; set "
         f"{ENV_RABBITMQ_CA_FILE} to the CA that signs it"),
        ("127.0.0.1", "ca", "ca", "redis rediss://:***@127.0.0.1:{redis_port}/0: TLS certificate not trusted (IP address "
         f"mismatch, certificate is not valid for '127.0.0.1'.); trusting the system's CAs and {ENV_REDIS_CA_FILE}={{ca}}"),
    ],
    ids=["a wrong CA", "no CA", "another host name"],
)
def test_an_untrusted_certificate_fails_at_once(host, redis_ca, amqp_ca, expected, pki, tls_redis, tls_amqp, tls_rabbit):
    cas = {"redis_ca": TrustedCA(ENV_REDIS_CA_FILE, file=getattr(pki, redis_ca))}
    if amqp_ca is not None:
        cas["amqp_ca"] = TrustedCA(ENV_RABBITMQ_CA_FILE, file=getattr(pki, amqp_ca))
    started = time.monotonic()
    with pytest.raises(TransportError) as failure:
        connect("tls-refused", redis_url=tls_redis.replace("@localhost:", f"@{host}:"), amqp_url=tls_amqp,
                role="supervisor", **cas)
    assert time.monotonic() - started < CONNECT_SECONDS
    assert str(failure.value) == expected.format(redis_port=port_of(tls_redis), amqp_port=tls_rabbit.port, ca=pki.ca,
                                                 other_ca=pki.other_ca)
    assert_no_password(str(failure.value))


def test_the_operator_deletes_a_jobs_keys_over_tls_with_the_ca_from_a_secret(pki, tls_redis):
    """The operator has no CA file: it reads spec.redis.caSecretRef's PEM (mlless_operator.reconcile.service_urls)."""
    client = redis.Redis.from_url(tls_redis, ssl_ca_certs=pki.ca)
    client.set("mlless:tls-cleanup:a", b"1")
    client.close()
    ca = TrustedCA("spec.redis.caSecretRef", pem=Path(pki.ca).read_text())
    assert delete_job_keys(tls_redis, "tls-cleanup", ca=ca) == 1
    with pytest.raises(TransportError) as refused:
        delete_job_keys(tls_redis, "tls-cleanup", ca=TrustedCA("spec.redis.caSecretRef", pem=Path(pki.other_ca).read_text()))
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert_no_password(str(refused.value))

"""Property-based fuzzing of every parser that reads what crossed a process or trust boundary (#22): each input
either parses or raises the parser's one error type, with a message; nothing else escapes, nothing hangs.

Bounded for the default suite (a few hundred examples each); the fuzz suite (`python -m benchmarks fuzz`) runs the
same targets under atheris, coverage-guided, for longer. The frame codec and the control messages are fuzzed in tests/test_wire.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_targets import TARGETS, findings, valid_seeds

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return valid_seeds(tmp_path_factory.mktemp("fuzz"))


def mutations(seed: bytes) -> st.SearchStrategy[bytes]:
    """`seed` with a few bytes flipped, inserted, deleted or cut off: inputs that get past the first checks."""
    def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
        out = bytearray(data)
        for kind, at, value in edits:
            at = at % (len(out) + 1)
            if kind == 0 and at < len(out):
                out[at] = value
            elif kind == 1:
                out.insert(at, value)
            elif kind == 2 and at < len(out):
                del out[at]
            elif kind == 3:
                del out[at:]
        return bytes(out)

    edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
    return st.builds(mutate, st.just(seed), edits)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_random_bytes_parse_or_raise_the_parsers_error(name):
    target = TARGETS[name]

    @given(st.binary(max_size=2000))
    @SETTINGS
    def run(data: bytes) -> None:
        target(data)

    run()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_valid_inputs_parse_or_raise_the_parsers_error(name, seeds):
    target = TARGETS[name]

    @given(st.data())
    @SETTINGS
    def run(data) -> None:
        target(data.draw(mutations(data.draw(st.sampled_from(seeds[name])))))

    for seed in seeds[name]:
        target(seed)  # the valid inputs themselves parse
    run()


@pytest.mark.parametrize("name, data", [pytest.param(name, data, id=f"{name}/{file}")
                                        for name, inputs in findings().items() for file, data in inputs.items()])
def test_past_findings_parse_or_raise_the_parsers_error(name, data):
    TARGETS[name](data)


def test_the_coverage_guided_harness_runs_every_target(tmp_path):
    """The fuzz suite (benchmarks/fuzz.py, atheris) for a second per target: each starts from its valid inputs and
    past findings and finds nothing. The seed is fixed, so that a run here repeats; exploring is the benchmark's job,
    for longer."""
    run = subprocess.run([sys.executable, "-m", "benchmarks", "fuzz", "--seconds", "1", "--seed", "1", "--out",
                          str(tmp_path)], cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and not line.startswith("| target")]
    assert sorted(row.split(" | ")[0][2:] for row in rows) == sorted(TARGETS)
    assert all(row.endswith("| none |") and int(row.split(" | ")[1]) > 0 for row in rows)

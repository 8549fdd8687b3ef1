"""`mlless prepare --sample` offers exactly the samples of `mlless.data.sample.SAMPLES`."""
from __future__ import annotations

import pytest

from mlless.data.cli import main as prepare_main
from mlless.data.sources import PrepareError, sample_source
from mlless.data.sample import SAMPLES, ImageSample


def test_the_cli_rejects_a_sample_that_is_not_bundled(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare_main(["prepare", "--sample", "no-such-sample", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert all(name in err for name in SAMPLES)


def test_each_ratings_sample_is_a_source_that_records_where_it_comes_from():
    """(An image sample records it in its `ImageSet`: tests/test_prepare_images.py.)"""
    for name, sample in SAMPLES.items():
        if isinstance(sample, ImageSample):
            with pytest.raises(PrepareError, match="of images"):
                sample_source(name)
        else:
            assert sample_source(name).description == {"sample": name, "via": sample.via}
    with pytest.raises(PrepareError, match=", ".join(SAMPLES)):
        sample_source("no-such-sample")

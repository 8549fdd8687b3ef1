"""The `mlless prepare` subcommand (registered into the main CLI by `add_prepare_parser`)."""
from __future__ import annotations

import argparse
import sys

from mlless.contract import EXIT_FAILED, EXIT_USAGE
from mlless.data.csvfile import CsvOptions
from mlless.data.formats import LibsvmOptions
from mlless.data.manifest import LABEL_KINDS, MAX_CLASSES, MAX_IMAGE_SIDE, DatasetError
from mlless.data.prepare import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_HASH_BITS,
    DEFAULT_SAMPLE_BATCH_SIZE,
    DEFAULT_VALIDATION_FRACTION,
    PrepareOptions,
    prepare,
    prepare_file,
)
from mlless.data.image_formats import IMAGE_FORMATS, REAL_LABEL_FORMATS, read_images
from mlless.data.images import CLASSES, REAL
from mlless.data.prepare_images import DEFAULT_IMAGE_BATCH_SIZE, prepare_images
from mlless.data.errors import PrepareError
from mlless.data.sources import (
    sample_source, synthetic_blobs_source, synthetic_higgs_source, synthetic_lr_source,
    synthetic_pmf_source,
)
from mlless.data.sample import DIGITS, MOVIELENS_SMALL, SAMPLES, ImageSample, SampleUnavailable
from mlless.data.synthetic import CLICK_TASKS, DEFAULT_SKEW, BlobsParams, HiggsParams, LrParams, PmfParams
from mlless.data.text import MalformedInputError

DESCRIPTION = """\
Turn raw data into shuffled mini-batch files plus manifest.json.

Exactly one of: --format FMT INPUT, --sample NAME, --synthetic KIND.

Layout written under --out (a directory or fsspec URL such as s3://bucket/x):
  manifest.json              sizes, dimensions, statistics, sha256 of every file
  train/batch-000000.npz ... shuffled batches of exactly --batch-size rows (last may be short)
  validation.npz             the held-out split
  ids.npz                    (ratings) raw user/item id of every re-indexed id

Ratings: users/items are re-indexed 0..n-1 from the training split; validation
ratings with a user or item unseen in training are dropped and counted.

Images (--format npz, cifar, mnist, image-folder; --sample digits): batches of
uint8 pixels, channels first, with class ids 0..K-1 (the input's labels in
sorted order); the manifest holds the image shape, the classes, and each
channel's pixel mean and standard deviation over the training images (0-255
scale). Image inputs are read whole into memory.
  npz           X, of shape (n, H, W) or channels-last (n, H, W, C), uint8 or
                integers in [0, 255] or floats in [0, 1] (scaled by 255), and
                y, one label (integer or word) an image; with --labels real,
                one real target an image, kept as float32 (for
                neural-net-regression; the manifest holds their mean and
                standard deviation instead of classes)
  cifar         CIFAR-10/100's python batches: their directory, the .tar.gz as
                distributed (read without extracting), or one batch file;
                the training part is data_batch_1..5 (CIFAR-100: train)
  mnist         idx files, gzipped or not (MNIST, Fashion-MNIST): their
                directory (train-images-idx3-ubyte, train-labels-idx1-ubyte)
                or the images file, its labels file beside it
  image-folder  one sub-folder of PNG/JPEG images per class (needs Pillow);
                --image-size resizes them; RGB, or 1 channel if all are gray
With --validation, a second input of the same format is the validation split;
of a cifar or mnist one its test part is read (test_batch, t10k-*), so naming
INPUT again validates on the distribution's test set.
"""

EPILOG = f"""\
examples:
  mlless prepare --sample {MOVIELENS_SMALL.name} --out data/ml-small
  mlless prepare --sample {DIGITS.name} --out data/digits
  mlless prepare --format npz images.npz --out data/images
  mlless prepare --format npz images.npz --labels real --out data/targets
  mlless prepare --format cifar cifar-10-python.tar.gz --validation cifar-10-python.tar.gz --out data/cifar10
  mlless prepare --format mnist fashion-mnist/ --out data/fashion
  mlless prepare --format image-folder photos/ --image-size 64 --out data/photos
  mlless prepare --format movielens ml-10M100K/ratings.dat --out s3://bucket/ml10m
  mlless prepare --format criteo train.txt --out data/criteo --hash-bits 20 --on-error skip
  mlless prepare --format csv flights.csv --label delayed --out data/flights
  mlless prepare --synthetic pmf --rows 10000000 --users 70000 --items 10000 --out data/syn
"""


def add_prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `prepare` on the main CLI's subparsers."""
    p = subparsers.add_parser(
        "prepare",
        help="prepare a dataset into mini-batch files",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("input (choose one)")
    src.add_argument("input", nargs="?", help="input file (local path or fsspec URL; .gz/.bz2/.xz are decompressed)")
    src.add_argument("--format", choices=["movielens", "criteo", "libsvm", "csv", *IMAGE_FORMATS],
                     help=f"format of INPUT ({', '.join(IMAGE_FORMATS)}: images, see above)")
    src.add_argument("--sample", choices=list(SAMPLES), help="a bundled sample: "
                     + "; ".join(f"{sample.name}, {sample.description} (needs: {sample.needs})"
                                 for sample in SAMPLES.values()))
    src.add_argument("--synthetic", choices=["pmf", *CLICK_TASKS, "higgs", "blobs"],
                     help="generate low-rank ratings (pmf), Criteo-like clicks labelled 0/1 (lr), with real labels "
                          "(regression) or --classes classes (multiclass), dense Higgs-like rows (higgs), or "
                          "--clusters Gaussian blobs of --features dense features, for kmeans (blobs)")
    p.add_argument("--out", required=True, help="output directory or fsspec URL (memory://, s3://...)")

    o = p.add_argument_group("batching and split")
    o.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"rows per batch (default {DEFAULT_BATCH_SIZE}, as in the paper; {DEFAULT_SAMPLE_BATCH_SIZE} for a ratings "
             f"--sample; {DEFAULT_IMAGE_BATCH_SIZE} for images)",
    )
    o.add_argument(
        "--validation-fraction",
        type=float,
        default=DEFAULT_VALIDATION_FRACTION,
        help=f"fraction of rows held out, chosen by a seeded hash of the line (default {DEFAULT_VALIDATION_FRACTION})",
    )
    o.add_argument("--validation", metavar="FILE", default=None,
                   help="with --format: a file of the same format that is the validation split (a fixed split, as "
                        "Criteo's day 23 or MovieLens's given ones); INPUT then trains whole. cifar and mnist: "
                        "the test part of this input (test_batch, t10k-*)")
    o.add_argument("--image-size", metavar="SIZE", type=image_size, default=None,
                   help="image-folder: resize every image to SIZE, one side (32) or WIDTHxHEIGHT (64x48), "
                        "bilinear; without it every image must have the first one's size")
    o.add_argument("--max-validation-rows", type=int, default=None, help="cap the validation split (memory); extra rows train")
    o.add_argument("--seed", type=int, default=0, help="seed of the split and the shuffle (default 0)")
    o.add_argument("--on-error", choices=["fail", "skip"], default="fail", help="malformed lines: fail naming file:line (default) or skip and count")
    o.add_argument("--rating-range", type=float, nargs=2, metavar=("MIN", "MAX"), default=None,
                   help="movielens: ratings outside [MIN, MAX] are malformed lines (default: inferred from the first "
                        "ratings read, e.g. [0, 9.5] for 0.5-5 stars; the manifest's source records it)")
    o.add_argument("--tmp-dir", default=None, help="where shuffle buckets are spilled (default: system temp)")
    o.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

    f = p.add_argument_group("features (criteo, libsvm, csv, synthetic lr)")
    f.add_argument("--hash-bits", type=int, default=DEFAULT_HASH_BITS, help=f"feature space is 2**K (default {DEFAULT_HASH_BITS})")
    f.add_argument("--integer-transform", choices=["log1p", "minmax"], default="log1p", help="Criteo integer columns: log1p(max(x,0)) (default) or min-max from training stats")
    f.add_argument("--libsvm-base", type=int, choices=[0, 1], default=1, help="libsvm index base (default 1)")
    f.add_argument("--libsvm-indices", choices=["keep", "hash"], default="keep", help="keep libsvm indices (n_features = max+1) or hash them into 2**K")
    f.add_argument("--label", metavar="COL", help="csv: the label column, by its header name or 0-based position; "
                   "the other columns are features: numeric ones as their values, the others hashed into 2**K")
    f.add_argument("--delimiter", default=",", help="csv: the field separator (default ',')")
    f.add_argument("--labels", choices=LABEL_KINDS, default=None,
                   help="libsvm and csv labels: binary (-1/0 and +1/1, for logistic-regression and svm), real (any number, "
                        f"for linear-regression) or classes (up to {MAX_CLASSES} distinct integers or words, numbered 0..K-1 "
                        "in sorted order, the manifest's feature_stats.label_values; for softmax, and with two for "
                        "svm and logistic-regression); "
                        f"default binary. Images: {CLASSES} (the default, for neural-net) or, with "
                        f"--format {' or '.join(REAL_LABEL_FORMATS)}, {REAL} (any finite number, for neural-net-regression)")

    s = p.add_argument_group("synthetic data")
    s.add_argument("--rows", type=int, default=None, help="rows to generate (default 1,000,000)")
    s.add_argument("--users", type=int, default=PmfParams.users, help=f"pmf users (default {PmfParams.users})")
    s.add_argument("--items", type=int, default=PmfParams.items, help=f"pmf items (default {PmfParams.items})")
    s.add_argument("--rank", type=int, default=PmfParams.rank, help=f"pmf planted rank (default {PmfParams.rank})")
    s.add_argument("--noise", type=float, default=PmfParams.noise, help=f"pmf noise std (default {PmfParams.noise})")
    s.add_argument("--vocabulary", type=int, default=LrParams.vocabulary, help=f"lr: distinct values per categorical column (default {LrParams.vocabulary})")
    s.add_argument("--skew", type=float, default=DEFAULT_SKEW,
                   help=f"Zipf exponent of user/item (pmf) and categorical-value (lr) popularity; 0 = uniform (default {DEFAULT_SKEW})")
    s.add_argument("--raw", action="store_true", help="pmf: do not clip ratings to [1, 5]")
    s.add_argument("--classes", type=int, default=LrParams.classes,
                   help=f"multiclass: the number of classes (default {LrParams.classes})")
    s.add_argument("--clusters", type=int, default=BlobsParams.clusters,
                   help=f"blobs: the number of blobs, of unequal sizes and spreads (default {BlobsParams.clusters})")
    s.add_argument("--features", type=int, default=BlobsParams.features,
                   help=f"blobs: dense features a row (default {BlobsParams.features})")
    p.set_defaults(func=run_prepare)


def image_size(text: str) -> tuple[int, int]:
    """`--image-size`: one side, or WIDTHxHEIGHT, as (width, height)."""
    sides = text.lower().split("x")
    try:
        width, height = (int(sides[0]),) * 2 if len(sides) == 1 else map(int, sides) if len(sides) == 2 else (0, 0)
    except ValueError:
        width = height = 0
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise argparse.ArgumentTypeError(f"{text!r} is not one side or WIDTHxHEIGHT, each 1 to {MAX_IMAGE_SIDE} pixels")
    return width, height


def run_prepare(args: argparse.Namespace) -> int:
    """Handler for `mlless prepare`; returns the process exit code."""
    chosen = [x for x in (args.format, args.sample, args.synthetic) if x]
    if len(chosen) != 1:
        print("mlless prepare: choose exactly one of --format (with INPUT), --sample, --synthetic", file=sys.stderr)
        return EXIT_USAGE
    if args.format and not args.input:
        print(f"mlless prepare: --format {args.format} needs an INPUT file", file=sys.stderr)
        return EXIT_USAGE
    if args.validation and not args.format:
        print("mlless prepare: --validation FILE goes with --format and INPUT", file=sys.stderr)
        return EXIT_USAGE
    if args.image_size and args.format != "image-folder":
        print("mlless prepare: --image-size goes with --format image-folder", file=sys.stderr)
        return EXIT_USAGE
    if (args.format == "csv") != (args.label is not None):
        print("mlless prepare: --format csv needs --label COL, and --label goes with --format csv only", file=sys.stderr)
        return EXIT_USAGE
    if len(args.delimiter) != 1:
        print(f"mlless prepare: --delimiter must be one character, got {args.delimiter!r}", file=sys.stderr)
        return EXIT_USAGE
    if not args.format and args.input:
        print("mlless prepare: INPUT is only used with --format", file=sys.stderr)
        return EXIT_USAGE
    if args.synthetic == "multiclass" and not 2 <= args.classes <= MAX_CLASSES:
        print(f"mlless prepare: --classes must be in [2, {MAX_CLASSES}], got {args.classes}", file=sys.stderr)
        return EXIT_USAGE
    if args.synthetic == "blobs" and not (args.clusters >= 1 and args.features >= 1):
        print(f"mlless prepare: --clusters and --features must be >= 1, got {args.clusters} and {args.features}",
              file=sys.stderr)
        return EXIT_USAGE
    sample = SAMPLES.get(args.sample) if args.sample else None
    images = args.format in IMAGE_FORMATS or isinstance(sample, ImageSample)
    if images and args.labels not in (None, CLASSES) and not (args.labels == REAL and args.format in REAL_LABEL_FORMATS):
        print(f"mlless prepare: --labels {args.labels} does not go with "
              + (f"--format {args.format}" if args.format else f"--sample {args.sample}")
              + f": its images' labels are {CLASSES}"
              + (f"; {REAL} targets come in --format {' or '.join(REAL_LABEL_FORMATS)}" if args.labels == REAL else ""),
              file=sys.stderr)
        return EXIT_USAGE
    labels = args.labels or (CLASSES if images else LABEL_KINDS[0])
    batch_size = args.batch_size or (DEFAULT_IMAGE_BATCH_SIZE if images else
                                     DEFAULT_SAMPLE_BATCH_SIZE if args.sample else DEFAULT_BATCH_SIZE)
    options = PrepareOptions(
        batch_size=batch_size,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        hash_bits=args.hash_bits,
        on_error=args.on_error,
        integer_transform=args.integer_transform,
        max_validation_rows=args.max_validation_rows,
        progress=not args.quiet,
        tmp_dir=args.tmp_dir,
        rating_range=None if args.rating_range is None else tuple(args.rating_range),
    )
    try:
        if args.format in IMAGE_FORMATS:
            prepare_images(read_images(args.format, args.input, args.validation, args.image_size, labels), args.out,
                           options)
        elif isinstance(sample, ImageSample):
            prepare_images(sample.load(), args.out, options)
        elif args.format:
            prepare_file(args.format, args.input, args.out, options,
                         LibsvmOptions(base=args.libsvm_base, indices=args.libsvm_indices, labels=labels),
                         args.validation,
                         CsvOptions(args.label, labels=labels, delimiter=args.delimiter) if args.label else None)
        elif args.sample:
            prepare(sample_source(args.sample), args.out, options)
        elif args.synthetic == "pmf":
            params = PmfParams(
                rows=args.rows or PmfParams.rows, users=args.users, items=args.items, rank=args.rank, noise=args.noise, clip=not args.raw,
                skew=args.skew,
            )
            prepare(synthetic_pmf_source(params, args.seed), args.out, options)
        elif args.synthetic == "blobs":
            blobs = BlobsParams(rows=args.rows or BlobsParams.rows, features=args.features, clusters=args.clusters)
            prepare(synthetic_blobs_source(blobs, args.seed), args.out, options)
        elif args.synthetic == "higgs":
            prepare(synthetic_higgs_source(HiggsParams(rows=args.rows or HiggsParams.rows), args.seed), args.out, options)
        else:
            params_lr = LrParams(rows=args.rows or LrParams.rows, hash_bits=args.hash_bits, vocabulary=args.vocabulary,
                                 skew=args.skew, task=args.synthetic, classes=args.classes)
            prepare(synthetic_lr_source(params_lr, args.seed), args.out, options)
    except (PrepareError, MalformedInputError, DatasetError, SampleUnavailable, FileNotFoundError) as exc:
        print(f"mlless prepare: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m mlless.data.cli prepare ...`) for use before the main CLI exists."""
    parser = argparse.ArgumentParser(prog="mlless")
    sub = parser.add_subparsers(dest="command", required=True)
    add_prepare_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())

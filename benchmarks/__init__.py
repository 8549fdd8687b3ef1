"""mlless's benchmarks: a few suites, each answering one question with tables, run by `python -m benchmarks SUITE`.

The driver (`__main__.py`) lists the suites; each suite is a module with `add_arguments(parser)` and
`run(args) -> str` (the markdown of its tables). Shared: `_common.py` (machine header, tables, data sets),
`_runs.py` (mlless jobs and their records), `_peers.py` and `_ddp.py` (the peers' runners), `netlink.py` (a
rate-limited link to private Redis and RabbitMQ). See README.md.
"""

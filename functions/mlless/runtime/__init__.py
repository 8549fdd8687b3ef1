"""The MLLess runtime: supervisor and worker functions, and how a local job launches them."""

"""Multi-rank jobs: per-rank summaries (the map) and the cross-rank diagnosis (the reduce).

The contract between the modules is docs/multirank.md.
"""

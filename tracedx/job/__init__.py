"""Multi-rank (distributed job) analysis: per-rank summaries and the cross-rank step.

See ``docs/multirank.md`` for the contract between the modules.
"""

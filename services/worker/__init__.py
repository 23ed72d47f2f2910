"""The worker: a thin FastStream shell around the sequencer and normaliser.

``batch`` turns a batch of raw entries into one atomic commit (``commit.lua``); ``app`` wires
FastStream batch subscribers to it; ``housekeeping`` reclaims, abandons idle runs, trims.
"""

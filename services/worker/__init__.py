"""The worker: a thin FastStream shell around the sequencer and normaliser.

``processor`` turns a batch of raw entries of one shard into one atomic commit; ``commit`` (with
``commit.lua`` beside it) is that commit: what it writes, typed, and the script that writes it;
``app`` wires FastStream batch subscribers to the processor; ``housekeeping`` reclaims, abandons
idle runs, trims.
"""

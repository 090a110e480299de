"""Sampling: the sampler and its verified blocks, request batches, grids, transfers and walks."""

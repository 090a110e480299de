"""Data: the MNIST files, their preparation and loading, splits, synthetic digits, uploaded digits."""

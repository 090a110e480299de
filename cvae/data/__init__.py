"""Data: dataset specs; the built-in datasets' files and one's own images, prepared and loaded;
splits, synthetic digits, uploaded digits."""

"""Evaluation: the eval run, IWAE, fidelity, precision/recall, label swap, classification,
reports."""

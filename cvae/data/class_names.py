"""A class as people name it -> its label index, for every place a user picks a class.

`cvae sample --label`, the service's `label=` parameters and the page all take a class by its
name in the dataset spec (`DatasetSpec.class_names`: "dog", "Ankle boot", "7") or by its index
(0..num_classes - 1). A name is matched exactly first, so a dataset whose classes are numbers
("10", "20") is read by name; any other decimal is an index. Anything else is refused with the
valid names, which is what a user needs to try again. Pure Python, no NumPy or JAX.
"""

from __future__ import annotations

from collections.abc import Sequence

from cvae.errors import ConfigError

LISTED_NAMES = 40  # an error lists at most this many names (a dataset may have 1,000)


class UnknownLabel(ConfigError):
    """A label that is neither a class name of the model nor an index of one.

    `names`: the model's class names, for a reply that lists them (the service's 422)."""

    def __init__(self, message: str, names: Sequence[str]):
        super().__init__(message)
        self.names = tuple(names)


def describe_classes(names: Sequence[str]) -> str:
    """The classes as an error lists them: 'cat, dog, bird (or their indices 0..2)'."""
    shown = ", ".join(repr(name) if _needs_quotes(name) else name
                      for name in names[:LISTED_NAMES])
    more = f", and {len(names) - LISTED_NAMES} more" if len(names) > LISTED_NAMES else ""
    return f"{shown}{more} (or their indices 0..{len(names) - 1})"


def _needs_quotes(name: str) -> bool:
    return not name or name != name.strip() or "," in name


def label_index(names: Sequence[str], label: str | int) -> int:
    """The index of class `label` (a name in `names`, or an index into it); UnknownLabel
    listing the names otherwise."""
    text = str(label)
    if text in names:
        return list(names).index(text)
    stripped = text.strip()
    if stripped.isdecimal() and int(stripped) < len(names):
        return int(stripped)
    raise UnknownLabel(f"label {text!r}: not a class of this model; its classes are "
                       f"{describe_classes(names)}", names)

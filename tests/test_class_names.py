"""cvae.data.class_names: a class by its name or its index, and the one line that lists the
names when it is neither."""

import pytest

from cvae.data.class_names import LISTED_NAMES, UnknownLabel, describe_classes, label_index
from cvae.data.specs import DIGITS, FASHION
from cvae.errors import ConfigError

PETS = ("cat", "dog", "bird")


@pytest.mark.parametrize("label, index", [("dog", 1), ("bird", 2), ("0", 0), ("2", 2), (1, 1),
                                          (" 2", 2)])
def test_a_class_is_read_by_name_or_by_index(label, index):
    assert label_index(PETS, label) == index


def test_a_name_that_is_a_number_is_read_as_the_name_first():
    assert label_index(("10", "0", "5"), "0") == 1
    assert label_index(("10", "0", "5"), "2") == 2  # not a name: its index
    assert label_index(DIGITS, "7") == 7
    assert label_index(FASHION, "Ankle boot") == 9


@pytest.mark.parametrize("label", ["cow", "Dog", "3", "-1", "1.0", ""])
def test_an_unknown_class_is_refused_listing_the_names(label):
    with pytest.raises(UnknownLabel) as excinfo:
        label_index(PETS, label)
    assert isinstance(excinfo.value, ConfigError)  # a user error: one line, exit code 2
    assert str(excinfo.value) == (f"label {label!r}: not a class of this model; its classes "
                                  f"are cat, dog, bird (or their indices 0..2)")
    assert excinfo.value.names == PETS


def test_a_long_list_of_names_is_cut_and_counted():
    names = tuple(f"class{i}" for i in range(1000))
    text = describe_classes(names)
    assert text.startswith("class0, class1,") and f"class{LISTED_NAMES - 1}," in text
    assert f"class{LISTED_NAMES}," not in text
    assert text.endswith(f"and {1000 - LISTED_NAMES} more (or their indices 0..999)")


def test_names_with_commas_or_spaces_at_the_ends_are_quoted():
    assert describe_classes(("a, b", " c", "T-shirt/top")) == (
        "'a, b', ' c', T-shirt/top (or their indices 0..2)")

"""The loss curve: labelled axes over epochs, one line per split and term, values as logged."""

import numpy as np
from PIL import Image

from cvae.training.loss_curve import loss_curve_figure, save_loss_curve

RECORDS = [
    {"epoch": 1, "train_loss": 150.0, "train_kl": 4.0, "test_loss": 140.0, "test_kl": 5.0},
    {"epoch": 2, "train_loss": 130.0, "train_kl": 6.0, "test_loss": 128.0, "test_kl": 6.5},
    {"epoch": 3, "train_loss": 125.0, "train_kl": 7.0, "test_loss": float("nan"),
     "test_kl": 7.2},
]


def test_loss_and_kl_panels_have_labelled_axes_and_the_logged_values():
    loss_ax, kl_ax = loss_curve_figure(RECORDS).axes
    for ax, ylabel in ((loss_ax, "loss (nats per image)"), (kl_ax, "KL (nats per image)")):
        assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == ylabel
    lines = {line.get_label(): line for line in loss_ax.lines}
    train = lines["train (mean since the previous evaluation)"]
    test = lines["test set (at the evaluation)"]
    np.testing.assert_array_equal(train.get_xdata(), [1, 2, 3])
    np.testing.assert_array_equal(train.get_ydata(), [150.0, 130.0, 125.0])
    # A non-finite value is left out, not drawn as a gap-filling zero.
    np.testing.assert_array_equal(test.get_xdata(), [1, 2])
    np.testing.assert_array_equal(test.get_ydata(), [140.0, 128.0])
    kl = {line.get_label(): line.get_ydata().tolist() for line in kl_ax.lines}
    assert kl == {"train (mean since the previous evaluation)": [4.0, 6.0, 7.0],
                  "test set (at the evaluation)": [5.0, 6.5, 7.2]}
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == list(lines)


def test_a_validation_split_is_drawn_under_its_own_name():
    records = [{"epoch": e, "train_loss": 10.0 - e, "validation_loss": 11.0 - e}
               for e in (1, 2)]
    labels = [line.get_label() for line in loss_curve_figure(records).axes[0].lines]
    assert labels == ["train (mean since the previous evaluation)",
                      "validation (at the evaluation)"]


def test_saved_png_is_written_atomically(tmp_path):
    path = save_loss_curve(RECORDS, tmp_path / "out" / "loss_curve.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1000, 400)
    assert [p.name for p in path.parent.iterdir()] == ["loss_curve.png"]

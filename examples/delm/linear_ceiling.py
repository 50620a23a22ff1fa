"""Noise-free ceiling of a linear head on MNIST: multinomial logistic regression, no privacy at all.

    python examples/delm/linear_ceiling.py      # ~2 min on 2 cores

The functional mechanism trains a linear head (hidden layers have no sensitivity bound), so
no DELM configuration can beat the best linear classifier of the same inputs. This prints its
test accuracy on the 784 raw pixels, on the 196 pooled unit-norm features DELM uses
(``flwr_dp_experiments.datasets.unit_norm_features``) and on the 294 HOG features of the
``-hog`` configurations (``flwr_dp_experiments.feature_maps.hog_features``); see results/RESULTS.md.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sklearn.linear_model import LogisticRegression  # noqa: E402

from flwr_dp_experiments.datasets import load_dataset, unit_norm_features  # noqa: E402
from flwr_dp_experiments.feature_maps import hog_features  # noqa: E402


def main() -> None:
    x_train, y_train, x_test, y_test = load_dataset("mnist")
    inputs = {
        "784 standardised pixels": (x_train, x_test, 1.0),
        "196 pooled unit-norm features (DELM's)": (
            unit_norm_features(x_train, "mnist", 2),
            unit_norm_features(x_test, "mnist", 2),
            1e4,
        ),
        "294 HOG features (the -hog configurations)": (
            hog_features(x_train, cell=4, bins=6),
            hog_features(x_test, cell=4, bins=6),
            1e4,
        ),
    }
    for name, (train, test, inverse_reg) in inputs.items():
        start = time.time()
        model = LogisticRegression(max_iter=200, C=inverse_reg).fit(train, y_train)
        print(f"{name}: test accuracy {model.score(test, y_test):.4f} ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

"""predict_comm_after with `layout_of`: candidates that share a layout pass it once, and get the very numbers they
get with the layout repeated per candidate (search's plans must not move with how it batches its questions)."""

import numpy as np
import pytest

from shardwise.search.simulator import predict_comm_after_ms


@pytest.mark.parametrize("num_devices", [2, 16, 64])
def test_shared_layouts_give_the_same_all_to_all_bit_for_bit(fitted_cost_model, num_devices):
    model, _ = fitted_cost_model
    rng = np.random.default_rng(num_devices)
    layouts, n = 7, 40
    widths = rng.integers(0, 512, (layouts, num_devices)).astype(float)
    compute = rng.random((layouts, num_devices)) * 5
    layout_of = rng.integers(0, layouts, n)
    devices = rng.integers(0, num_devices, (n, 1))
    devices[0, 0] = compute[layout_of[0]].argmax()  # the slowest device takes more work
    added, new = rng.integers(4, 128, n).astype(float), rng.random((n, 1)) * 6
    repeated = model.predict_comm_after(widths[layout_of], compute[layout_of], devices, added, new)
    shared = model.predict_comm_after(widths, compute, devices, added, new, layout_of=layout_of)
    np.testing.assert_array_equal(shared, repeated)
    np.testing.assert_array_equal(
        predict_comm_after_ms(model, widths, compute, devices, added, new, layout_of=layout_of), repeated
    )
    # a model without the fast path (a test double) is asked the same through the whole layouts
    slow = type("Slow", (), {"predict_comm": model.predict_comm})()
    np.testing.assert_allclose(
        predict_comm_after_ms(slow, widths, compute, devices, added, new, layout_of=layout_of),
        repeated,
        rtol=1e-5,
    )


def test_a_layout_index_that_does_not_match_the_candidates_is_refused(fitted_cost_model):
    model, _ = fitted_cost_model
    widths, compute = np.ones((3, 4)), np.ones((3, 4))
    with pytest.raises(ValueError, match=r"devices and new_compute_ms must be \[2, K\]"):
        model.predict_comm_after(
            widths,
            compute,
            np.zeros((3, 1), dtype=int),
            np.ones(2),
            np.ones((3, 1)),
            layout_of=np.array([0, 2]),
        )

"""Measured against target and prediction in words (notebook 08): a miss is said, not only
shown as a number."""

import math

import pytest

from tern.measure.verdict import SpeedCheck, render_speed_checks, speed_checks


def _row(t, measured, predicted):
    return {"name": "pick", "threads": t, "tok_per_s": measured, "predicted_tok_per_s": predicted}


def test_a_miss_is_said_in_words():
    checks = speed_checks([_row(2, 127.0, 184.0), _row(1, 92.0, 122.0)], 100.0)
    assert [c.threads for c in checks] == [1, 2]
    one, two = checks
    assert not one.reaches_target and one.prediction_holds  # 0.92 of the target; 0.75 of the prediction
    assert two.reaches_target and not two.prediction_holds  # 0.69 of its prediction
    text = render_speed_checks(checks)
    lines = text.splitlines()
    assert lines[0] == ("1 thread: measured 92.0 tok/s MISSES the 100 tok/s target: 8% short. The prediction, "
                        "122.0 tok/s, holds: measured / predicted 0.75, within ±25%.")
    assert "reaches the 100 tok/s target (1.27x)" in lines[1]
    assert "MISSES its ±25% check: measured / predicted 0.69, too optimistic by 31%" in lines[1]
    assert lines[2].startswith("Verdict: the 100 tok/s target is reached with 2 threads, NOT with 1 thread.")
    assert "off by more than ±25% with 2 threads" in lines[2]


def test_verdicts_all_reached_none_reached_and_stand_in():
    rows = [_row(1, 92.0, 100.0), _row(2, 127.0, 130.0)]
    assert render_speed_checks(speed_checks(rows, 50.0)).splitlines()[-1] == (
        "Verdict: the 50 tok/s target is reached at every thread count measured.")
    last = render_speed_checks(speed_checks(rows, 200.0), stand_in=True).splitlines()[-1]
    assert last.startswith("Verdict: the 200 tok/s target is NOT reached: the best is 127.0 tok/s with 2 thread(s), "
                           "36% short.")
    assert last.endswith("(A scaled-down stand-in was measured, not the full model.)")
    assert SpeedCheck(1, 130.0, 100.0, 100.0).sentence().endswith("too pessimistic by 30%.")


@pytest.mark.parametrize(("rows", "target", "match"), [
    ([], 100.0, "no sweep rows"),
    ([_row(1, 90.0, 100.0)], 0.0, "target_tok_per_s"),
    ([_row(1, 90.0, 100.0)], math.inf, "target_tok_per_s"),
    ([_row(1, 0.0, 100.0)], 100.0, "tok_per_s must be a positive number"),
    ([_row(1, 90.0, math.nan)], 100.0, "predicted_tok_per_s must be a positive number"),
    ([{"threads": 1}], 100.0, "tok_per_s must be a positive number, got None"),
])
def test_bad_rows_are_clear_errors(rows, target, match):
    with pytest.raises(ValueError, match=match):
        speed_checks(rows, target)

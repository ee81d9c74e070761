"""Chapter 6's checkers: right answers, near misses, and bad input.

Answers are written here independently of the checkers' references, and the tests pin
what the checkers print.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from beyondgrad import compat, runtime
from beyondgrad import exercises as ex
from beyondgrad.exercises import ch6

runtime.ensure_cpu_devices(8)


def stub(*args):
    raise NotImplementedError


def clip_right(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    mad = lax.pmean(jnp.mean(jnp.abs(e_l - median)), "data")
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_sorted(e_l):  # another way to the median: sort all values
    everyone = jnp.sort(lax.all_gather(e_l, "data", tiled=True))
    n = everyone.shape[0]
    median = 0.5 * (everyone[(n - 1) // 2] + everyone[n // 2])
    mad = jnp.mean(jnp.abs(everyone - median))
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_local_median(e_l):
    median = jnp.median(e_l)
    mad = jnp.mean(jnp.abs(e_l - median))
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_std(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    std = jnp.std(everyone)
    return jnp.clip(e_l, median - 3.0 * std, median + 3.0 * std)


def clip_scale_2(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    mad = jnp.mean(jnp.abs(everyone - median))
    return jnp.clip(e_l, median - 2.0 * mad, median + 2.0 * mad)


def grads_right(w, x):
    w = compat.pcast_varying(w, "data")
    return jax.vmap(jax.grad(ch6.toy_log_psi), in_axes=(None, 0))(w, x)


def grads_by_hand(w, x):  # d/dW sum tanh(x W) = x outer (1 - tanh^2)
    t = jnp.tanh(x @ w)
    return x[:, :, None] * (1 - t * t)[:, None, :]


def grads_uncast(w, x):
    return jax.vmap(jax.grad(ch6.toy_log_psi), in_axes=(None, 0))(w, x)


def grads_flat(w, x):
    return grads_by_hand(w, x).reshape(x.shape[0], -1)


@pytest.mark.parametrize("answer", [clip_right, clip_sorted])
def test_clip_right_answers_pass(answer):
    for seed in (0, 1):
        fb = ch6.check_clip(answer, seed=seed)
        assert fb.passed, str(fb)


def test_clip_stub_and_value():
    assert not ch6.check_clip(stub).attempted
    fb = ch6.check_clip(jnp.ones(3))
    assert not fb.passed and "pass the function itself" in str(fb)


@pytest.mark.parametrize(
    "answer, words",
    [
        (clip_local_median, "each device's own median"),
        (clip_std, "standard deviation"),
        (clip_scale_2, "off by"),
        (lambda e: e, "nothing was clipped"),
    ],
)
def test_clip_near_misses_named(answer, words):
    # a seed whose first case has 5+ walkers per device (with 2, a per-device
    # window of 3 deviations clips nothing, and the checker says that instead)
    seed = next(s for s in range(50) if ch6._sizes(s, 2, 7)[0] >= 5)
    fb = ch6.check_clip(answer, seed=seed)
    assert not fb.passed and words in str(fb) and f"seed={seed}" in str(fb)
    with pytest.raises(ex.ExerciseFailed):
        ch6.check_clip(answer, seed=seed, strict=True)


def test_clip_sizes_are_drawn():
    sizes = {tuple(ch6._sizes(seed, 2, 7)) for seed in range(6)}
    assert len(sizes) > 1 and all(len(set(s)) == ch6.CASES for s in sizes)


@pytest.mark.parametrize("answer", [grads_right, grads_by_hand])
def test_grads_right_answers_pass(answer):
    fb = ch6.check_per_walker_grads(answer, seed=0)
    assert fb.passed, str(fb)


def test_grads_uncast_is_named_on_either_end():
    fb = ch6.check_per_walker_grads(grads_uncast, seed=1)
    assert not fb.passed
    text = str(fb)
    assert "cast" in text and "varying" in text, text


def test_grads_wrong_layout_and_stub():
    fb = ch6.check_per_walker_grads(grads_flat, seed=2)
    assert not fb.passed and "return (" in str(fb)
    assert not ch6.check_per_walker_grads(stub).attempted


def test_tolerance_pinned():
    assert ch6.TOL == 1e-12
    with pytest.raises(TypeError, match="seed"):
        ch6.check_clip(clip_right, seed="0")

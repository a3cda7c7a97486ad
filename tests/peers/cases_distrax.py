"""distrax's bijectors as cases.

distrax's conventions: `b.forward(x)`, `b.inverse(y)` and
`b.inverse_log_det_jacobian(y)`, the latter summed over `event_ndims_in`
only; the reference ildj is its sum over every element. A `Lambda` given
only its forward inverts it with distrax's own Jaxpr-based inverter (the
library's inverse is then itself automatic).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from _common import Case, fmt, params_rng, positive, real, unit, well_conditioned


def _case(name: str, b: Any, sample: Any, square: bool = True, note: str = "") -> Case:
    def ildj(y: Any) -> Any:
        return jnp.sum(b.inverse_log_det_jacobian(y))

    return Case("distrax", name, b.forward, b.inverse, ildj, sample, square, note)


def cases() -> list[Case]:
    import distrax
    from tensorflow_probability.substrates import jax as tfp

    tfb = tfp.bijectors
    out: list[Case] = []
    add = out.append
    rng = params_rng("distrax")

    add(_case("Sigmoid()", distrax.Sigmoid(), real(5, low=-4, high=4)))
    add(_case("Tanh()", distrax.Tanh(), real(5)))
    add(_case("GumbelCDF()", distrax.GumbelCDF(), real(5)))
    for shift, scale in [(1.0, 2.0), (-0.5, -3.0), (0.0, 0.25)]:
        add(
            _case(
                f"ScalarAffine(shift={shift}, scale={scale})",
                distrax.ScalarAffine(shift, scale),
                real(5),
            )
        )
    add(
        _case(
            "ScalarAffine(shift=1.0, log_scale=0.7)",
            distrax.ScalarAffine(1.0, log_scale=0.7),
            real(5),
        )
    )
    add(_case("Shift(2.5)", distrax.Shift(2.5), real(5)))
    add(_case("Inverse(Sigmoid())", distrax.Inverse(distrax.Sigmoid()), unit(5)))
    add(_case("Inverse(Tanh())", distrax.Inverse(distrax.Tanh()), unit(5, low=-0.9)))
    add(
        _case(
            "Chain([ScalarAffine(1, 2), Tanh(), ScalarAffine(0, 0.5)])",
            distrax.Chain(
                [
                    distrax.ScalarAffine(1.0, 2.0),
                    distrax.Tanh(),
                    distrax.ScalarAffine(0.0, 0.5),
                ]
            ),
            real(5),
        )
    )
    add(
        _case(
            "Block(ScalarAffine(0, 3), 1)",
            distrax.Block(distrax.ScalarAffine(0.0, 3.0), 1),
            real(4),
        )
    )
    add(
        _case(
            "Chain([tfb.Softplus(), ScalarAffine(-1, 2)])",
            distrax.Chain([tfb.Softplus(), distrax.ScalarAffine(-1.0, 2.0)]),
            real(5),
        )
    )
    # Lambda: forward and inverse given, or forward only (distrax inverts it).
    add(
        _case(
            "Lambda(sinh, arcsinh)",
            distrax.Lambda(forward=jnp.sinh, inverse=jnp.arcsinh),
            real(5),
        )
    )
    for label, fn, sample in [
        ("exp", jnp.exp, real(5)),
        ("lambda x: tanh(2x + 1)", lambda x: jnp.tanh(2.0 * x + 1.0), real(5)),
        ("lambda x: exp(x) * 3 - 1", lambda x: jnp.exp(x) * 3.0 - 1.0, real(5)),
        ("log1p", jnp.log1p, positive(5)),
        ("lambda x: x**3", lambda x: x**3, positive(5)),
    ]:
        add(_case(f"Lambda({label}) [forward only]", distrax.Lambda(fn), sample))
    # Linear maps.
    n = 4
    m = well_conditioned(n, rng)
    for lower in (True, False):
        add(
            _case(
                f"TriangularLinear(M={fmt(m)}, is_lower={lower})",
                distrax.TriangularLinear(m, is_lower=lower),
                real(n),
            )
        )
    bias = jnp.arange(float(n))
    add(
        _case(
            f"UnconstrainedAffine(M={fmt(m)}, bias)",
            distrax.UnconstrainedAffine(m, bias),
            real(n),
        )
    )
    add(
        _case(
            f"LowerUpperTriangularAffine(M={fmt(m)}, bias)",
            distrax.LowerUpperTriangularAffine(m, bias),
            real(n),
        )
    )
    diag = jnp.array([0.5, 2.0, -1.5, 3.0])
    add(_case(f"DiagLinear({fmt(diag)})", distrax.DiagLinear(diag), real(n)))
    u = jnp.asarray(rng.uniform(-0.5, 0.5, (n, 2)), jnp.float32)
    v = jnp.asarray(rng.uniform(-0.5, 0.5, (n, 2)), jnp.float32)
    add(
        _case(
            "DiagPlusLowRankLinear(diag=[1,2,1.5,3], rank-2 u, v)",
            distrax.DiagPlusLowRankLinear(jnp.array([1.0, 2.0, 1.5, 3.0]), u, v),
            real(n),
        )
    )
    # Splines.
    for bins, lo, hi, slopes in [
        (4, -3.0, 3.0, "unconstrained"),
        (8, -2.0, 2.0, "identity"),
    ]:
        params = jnp.asarray(rng.normal(size=3 * bins + 1), jnp.float32)
        add(
            _case(
                f"RationalQuadraticSpline({bins} bins, [{lo}, {hi}], {slopes})",
                distrax.RationalQuadraticSpline(params, lo, hi, boundary_slopes=slopes),
                real(5, low=lo * 1.3, high=hi * 1.3),
            )
        )
    # Couplings: conditioners are small fixed maps of the masked part.
    w = jnp.asarray(rng.uniform(-1, 1, (n, n)), jnp.float32)
    mask = jnp.array([True, False, True, False])

    def conditioner(x: Any) -> Any:
        h = jnp.tanh(x @ w)
        return h, 0.5 * h

    add(
        _case(
            "MaskedCoupling(mask=[1,0,1,0], ScalarAffine(shift, log_scale))",
            distrax.MaskedCoupling(
                mask,
                conditioner,
                lambda p: distrax.ScalarAffine(p[0], log_scale=p[1]),
            ),
            real(n),
        )
    )
    bins = 4
    w_spline = jnp.asarray(rng.uniform(-1, 1, (2, 2 * (3 * bins + 1))), jnp.float32)

    def spline_conditioner(x: Any) -> Any:
        return jnp.reshape(jnp.tanh(x) @ w_spline, (2, 3 * bins + 1))

    add(
        _case(
            "SplitCoupling(2, RationalQuadraticSpline(4 bins, [-3, 3]))",
            distrax.SplitCoupling(
                split_index=2,
                event_ndims=1,
                conditioner=spline_conditioner,
                bijector=lambda p: distrax.RationalQuadraticSpline(p, -3.0, 3.0),
            ),
            real(n),
        )
    )

    def affine_conditioner(x: Any) -> Any:
        return jnp.stack([jnp.sin(x), 0.3 * jnp.cos(x)])

    add(
        _case(
            "SplitCoupling(2, swap=True, ScalarAffine)",
            distrax.SplitCoupling(
                split_index=2,
                event_ndims=1,
                conditioner=affine_conditioner,
                bijector=lambda p: distrax.ScalarAffine(p[0], log_scale=p[1]),
                swap=True,
            ),
            real(n),
        )
    )
    add(
        _case(
            "Chain([MaskedCoupling, MaskedCoupling(~mask)])",
            distrax.Chain(
                [
                    distrax.MaskedCoupling(
                        ~mask,
                        conditioner,
                        lambda p: distrax.ScalarAffine(p[0], log_scale=p[1]),
                    ),
                    distrax.MaskedCoupling(
                        mask,
                        conditioner,
                        lambda p: distrax.ScalarAffine(p[0], log_scale=p[1]),
                    ),
                ]
            ),
            real(n),
        )
    )
    add(
        _case(
            "Block(Lambda(exp) [forward only], 1)",
            distrax.Block(distrax.Lambda(jnp.exp), 1),
            real(n),
        )
    )
    return out
